//! Lazy grammars: a grammar that constrains tokens only once a trigger has appeared.
//!
//! llama.cpp's own lazy grammar runs its trigger patterns with `std::regex` over all the text
//! accepted so far, once per token: backtracking that is quadratic at best and exponential for
//! some patterns, recursive enough to overflow the stack, and never interruptible. Its grammar
//! engine then keeps one stack per partial parse, unbounded in number for an ambiguous grammar
//! (a template's tool-call grammar is written from a request's tool schemas). This sampler waits
//! for the trigger in Rust, over at most the last `SEARCH_WINDOW` bytes: with the `regex` crate
//! (linear time, no recursion), or, for the look-around some formats' triggers use
//! (Functionary's `>>>(?!all)`), with `fancy-regex`, whose backtracking is bounded per search
//! (`BACKTRACK_LIMIT`); the grammar is GBNF compiled by llguidance (`guidance::gbnf`), whose
//! work per step is bounded; once triggered it is moved past the text from the trigger on, as
//! llama.cpp's would be [llama.cpp internal].

use std::ffi::CStr;
use std::sync::Arc;

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::token::LlamaToken;
use llama_cpp_sys_4::llama_token_data_array;
use regex::bytes::RegexBuilder;

use crate::errors::{Error, Result};
use crate::sampler::custom::{into_sampler, RustSampler};
use crate::sampler::guidance::{self, Guidance};

/// The longest trigger pattern accepted, in bytes.
const MAX_PATTERN_BYTES: usize = 1024;
/// The deepest nesting of groups a trigger pattern may have.
const MAX_NESTING: u32 = 32;
/// How far back from the newest text a trigger may start: each token searches this much.
pub const SEARCH_WINDOW: usize = 16 * 1024;
/// The most backtracking steps one search of a look-around pattern may take (measured: 2.4 ms
/// for a search stopped by it); past it the search fails, and with it the request.
const BACKTRACK_LIMIT: usize = 100_000;

/// A compiled trigger pattern.
pub enum Trigger {
    /// Matched byte-wise with ASCII classes, as `std::regex` does, in linear time.
    Linear(regex::bytes::Regex),
    /// A pattern with look-around, matched by a backtracking engine with a bounded number of
    /// steps, over the text's UTF-8.
    LookAround(fancy_regex::Regex),
}

/// `ValueError` for a trigger pattern that cannot be compiled: over `MAX_PATTERN_BYTES`,
/// nested deeper than `MAX_NESTING`, invalid, or with back-references (no format uses them).
/// Look-around, which the `regex` crate cannot run, is compiled for the bounded backtracking
/// engine.
pub fn compile(pattern: &str) -> Result<Trigger> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(Error::value(format!(
            "a trigger pattern may hold at most {MAX_PATTERN_BYTES} bytes, got {}",
            pattern.len()
        )));
    }
    let refused = |err: &dyn std::fmt::Display| Error::value(format!("trigger pattern {pattern:?}: {err}"));
    let linear = RegexBuilder::new(pattern)
        .unicode(false)
        .nest_limit(MAX_NESTING)
        .build();
    let err = match linear {
        Ok(regex) => return Ok(Trigger::Linear(regex)),
        Err(err) => err,
    };
    if !has_look_around(pattern) || has_back_reference(pattern) || nesting(pattern) > MAX_NESTING {
        return Err(refused(&err));
    }
    fancy_regex::RegexBuilder::new(pattern)
        .backtrack_limit(BACKTRACK_LIMIT)
        .build()
        .map(Trigger::LookAround)
        .map_err(|err| refused(&err))
}

fn has_look_around(pattern: &str) -> bool {
    ["(?=", "(?!", "(?<=", "(?<!"]
        .iter()
        .any(|opening| pattern.contains(opening))
}

fn has_back_reference(pattern: &str) -> bool {
    let bytes = pattern.as_bytes();
    bytes
        .windows(2)
        .any(|pair| pair[0] == b'\\' && (pair[1].is_ascii_digit() || pair[1] == b'k'))
}

/// The deepest nesting of groups in `pattern` (escaped and bracketed parentheses aside).
fn nesting(pattern: &str) -> u32 {
    let (mut depth, mut deepest, mut escaped, mut in_class) = (0u32, 0u32, false, false);
    for byte in pattern.bytes() {
        match byte {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'[' => in_class = true,
            b']' => in_class = false,
            b'(' if !in_class => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' if !in_class => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

impl Trigger {
    /// Where this trigger, found in `text` at or after `from`, makes the grammar start, as
    /// llama.cpp reckons it (at the first capture group that matched something, else at the
    /// match), and where the match ends. A look-around pattern searches the text after its
    /// last byte that is not UTF-8 (a character a token has only begun waits for the next);
    /// `ValueError` when its search passes `BACKTRACK_LIMIT`.
    fn start(&self, text: &[u8], from: usize) -> Result<Option<(usize, usize)>> {
        match self {
            Trigger::Linear(regex) => Ok(regex.captures_at(text, from).and_then(|found| {
                let whole = found.get(0)?;
                let group = found.iter().skip(1).flatten().find(|group| !group.is_empty());
                Some((group.unwrap_or(whole).start(), whole.end()))
            })),
            Trigger::LookAround(regex) => {
                let (offset, valid) = utf8_tail(text);
                let found = regex
                    .captures_from_pos(valid, from.saturating_sub(offset).min(valid.len()))
                    .map_err(|err| Error::value(format!("trigger pattern {:?}: {err}", regex.as_str())))?;
                Ok(found.and_then(|found| {
                    let whole = found.get(0)?;
                    let group = found.iter().skip(1).flatten().find(|group| !group.as_str().is_empty());
                    Some((offset + group.unwrap_or(whole).start(), offset + whole.end()))
                }))
            }
        }
    }
}

/// The longest stretch of `text` that is UTF-8 and ends where it ends (or before a character it
/// has only begun), and where it starts: one pass over `text`, however many bytes are not UTF-8.
fn utf8_tail(text: &[u8]) -> (usize, &str) {
    let (mut start, mut tail, mut at) = (0, "", 0);
    for chunk in text.utf8_chunks() {
        let (valid, invalid) = (chunk.valid(), chunk.invalid());
        at += valid.len() + invalid.len();
        // Bytes that can never be UTF-8 end the stretch; a character cut short at the very end
        // (whose bytes may still become one) only shortens it.
        let cut_short = at == text.len() && std::str::from_utf8(invalid).is_err_and(|err| err.error_len().is_none());
        (start, tail) = if invalid.is_empty() || cut_short {
            (at - valid.len() - invalid.len(), valid)
        } else {
            (at, "")
        };
    }
    (start, tail)
}

/// Where the first of `patterns` found in `text` (within its last `SEARCH_WINDOW` bytes) makes
/// the grammar start, and where its match ends.
fn trigger_start(patterns: &[Trigger], text: &[u8]) -> Result<Option<(usize, usize)>> {
    let from = text.len().saturating_sub(SEARCH_WINDOW);
    for pattern in patterns {
        if let Some(start) = pattern.start(text, from)? {
            return Ok(Some(start));
        }
    }
    Ok(None)
}

/// What every copy shares: the triggers, and the grammar compiled before any text.
struct Spec {
    model: Arc<LlamaModel>,
    grammar: Guidance,
    patterns: Vec<Trigger>,
    trigger_tokens: Vec<LlamaToken>,
}

#[derive(Clone)]
enum State {
    /// No trigger yet: the text accepted so far.
    Awaiting(Vec<u8>),
    /// Triggered: the grammar, constraining every later token.
    Triggered(Box<Guidance>),
}

struct LazyGrammar {
    spec: Arc<Spec>,
    state: State,
}

/// Builds a lazy grammar; the grammar is compiled once here, so a bad one fails now.
pub fn new(
    model: Arc<LlamaModel>,
    grammar: &str,
    root: &str,
    patterns: &[String],
    trigger_tokens: Vec<LlamaToken>,
) -> Result<llama_cpp_4::sampling::LlamaSampler> {
    let patterns = patterns.iter().map(|pattern| compile(pattern)).collect::<Result<_>>()?;
    let spec = Arc::new(Spec {
        grammar: guidance::gbnf(&model, grammar, root)?,
        model,
        patterns,
        trigger_tokens,
    });
    Ok(into_sampler(Box::new(LazyGrammar {
        spec,
        state: State::Awaiting(Vec::new()),
    })))
}

impl LazyGrammar {
    fn accept(&mut self, token: LlamaToken) -> Result<()> {
        let spec = Arc::clone(&self.spec);
        match &mut self.state {
            State::Triggered(grammar) => RustSampler::accept(&mut **grammar, token),
            State::Awaiting(_) if spec.trigger_tokens.contains(&token) => {
                let piece = crate::model::piece(&spec.model, token.0, true)?;
                self.trigger(&piece)
            }
            State::Awaiting(text) => {
                text.extend_from_slice(&crate::model::piece(&spec.model, token.0, true)?);
                match trigger_start(&spec.patterns, text)? {
                    // A grammar that does not take the trigger's own text (Functionary's calls
                    // start after the `>>>` that triggers them) starts after the match.
                    Some((start, end)) => {
                        let triggering = text.split_off(start);
                        self.trigger(&triggering)
                            .or_else(|refused| self.trigger(&triggering[end - start..]).map_err(|_| refused))
                    }
                    None => Ok(()),
                }
            }
        }
    }

    /// Starts the grammar, moved past `text` (where the trigger made it start).
    fn trigger(&mut self, text: &[u8]) -> Result<()> {
        let mut grammar = Box::new(self.spec.grammar.clone());
        grammar.advance(text)?;
        self.state = State::Triggered(grammar);
        Ok(())
    }
}

impl RustSampler for LazyGrammar {
    fn name(&self) -> &'static CStr {
        c"grammar"
    }

    fn accept(&mut self, token: LlamaToken) -> Result<()> {
        LazyGrammar::accept(self, token)
    }

    fn apply(&mut self, candidates: &mut llama_token_data_array) {
        if let State::Triggered(grammar) = &mut self.state {
            RustSampler::apply(&mut **grammar, candidates);
        }
    }

    fn reset(&mut self) -> Result<()> {
        self.state = State::Awaiting(Vec::new());
        Ok(())
    }

    fn copy(&self) -> Result<Box<dyn RustSampler>> {
        Ok(Box::new(LazyGrammar {
            spec: Arc::clone(&self.spec),
            state: self.state.clone(),
        }))
    }

    fn prepare(&mut self) {
        if let State::Triggered(grammar) = &mut self.state {
            RustSampler::prepare(&mut **grammar);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_compile_bytewise_and_look_around_for_the_bounded_engine() {
        assert!(matches!(compile(r"^\s*<tool_call>[\s\S]*"), Ok(Trigger::Linear(_))));
        assert!(matches!(compile(r">>>(?!all)"), Ok(Trigger::LookAround(_))));
        assert!(matches!(compile(r"(?<=a)b"), Ok(Trigger::LookAround(_))));
        assert!(compile("([").is_err());
        assert!(compile(r"(a)\1").is_err());
        assert!(compile(r"(?=(a))\1").is_err());
        assert!(compile(&format!("{}a{}", "(".repeat(40), ")".repeat(40))).is_err());
        assert!(compile(&format!("(?=a){}a{}", "(".repeat(40), ")".repeat(40))).is_err());
        assert!(compile(&"a".repeat(2000)).is_err());
    }

    #[test]
    fn the_start_is_the_first_group_that_matched_else_the_match() {
        let patterns = [compile(r"x(y)?(z)").unwrap()];
        assert_eq!(trigger_start(&patterns, b"..xz").unwrap(), Some((3, 4)));
        assert_eq!(trigger_start(&patterns, b"..xyz").unwrap(), Some((3, 5)));
        let patterns = [compile(r"tool").unwrap()];
        assert_eq!(trigger_start(&patterns, b"a tool").unwrap(), Some((2, 6)));
        assert_eq!(trigger_start(&patterns, b"a too").unwrap(), None);
        let anchored = [compile(r"^tool").unwrap()];
        let long = [b"x".repeat(SEARCH_WINDOW * 2), b"tool".to_vec()].concat();
        assert_eq!(trigger_start(&anchored, &long).unwrap(), None);
    }

    #[test]
    fn a_look_ahead_trigger_fires_on_a_recipient_and_not_on_all() {
        let patterns = [compile(r">>>(?!all)").unwrap()];
        assert_eq!(trigger_start(&patterns, b"hi >>>all\nHello").unwrap(), None);
        assert_eq!(
            trigger_start(&patterns, b">>>all\nHi.\n>>>get_weather").unwrap(),
            Some((11, 14))
        );
        // After bytes that are not UTF-8, and before a character a token has only begun.
        assert_eq!(trigger_start(&patterns, b"\xff\xfe>>>f\xe2\x82").unwrap(), Some((2, 5)));
        let grouped = [compile(r"(?<=x)(>>>)(?!all)").unwrap()];
        assert_eq!(trigger_start(&grouped, b"ax>>>f").unwrap(), Some((2, 5)));
        let anchored = [compile(r"^(?!a)tool").unwrap()];
        let long = [b"x".repeat(SEARCH_WINDOW * 2), b"tool".to_vec()].concat();
        assert_eq!(trigger_start(&anchored, &long).unwrap(), None);
    }

    #[test]
    fn the_utf8_tail_starts_after_the_last_byte_that_is_not_utf8() {
        assert_eq!(utf8_tail(b"ab\xffcd"), (3, "cd"));
        assert_eq!(utf8_tail(b"ab\xe2\x82"), (0, "ab")); // a character cut short
        assert_eq!(utf8_tail(b"ab\xff"), (3, ""));
        assert_eq!(utf8_tail(b"\xe2\x82ab"), (2, "ab")); // cut short, but not at the end
                                                         // One pass, however many invalid bytes: a hundred thousand of them.
        let text = [b"\xff".repeat(100_000), b">>>f".to_vec()].concat();
        assert_eq!(utf8_tail(&text), (100_000, ">>>f"));
    }

    #[test]
    fn a_search_past_the_backtracking_limit_fails() {
        // Two ways through each `a`, both backtracked into: 2**64 paths without the limit.
        let patterns = [compile(r"(?:(?=a)a|a)*b").unwrap()];
        let text = [b"a".repeat(64), b"!".to_vec()].concat();
        assert!(trigger_start(&patterns, &text).is_err());
    }
}
