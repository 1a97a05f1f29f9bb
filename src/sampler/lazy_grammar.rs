//! Lazy grammars: a grammar that constrains tokens only once a trigger has appeared.
//!
//! llama.cpp's own lazy grammar runs its trigger patterns with `std::regex` over all the text
//! accepted so far, once per token: backtracking that is quadratic at best and exponential for
//! some patterns, recursive enough to overflow the stack, and never interruptible. This sampler
//! waits for the trigger in Rust, with the `regex` crate (linear time, no recursion), and only
//! then builds llama.cpp's grammar and feeds it the text from the trigger on, as llama.cpp would
//! [llama.cpp internal].
//! The one pattern llama.cpp still sees is our own, anchored and as short as a token.

use std::ffi::CStr;
use std::sync::Arc;

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::sampling::LlamaSampler;
use llama_cpp_4::token::LlamaToken;
use llama_cpp_sys_4::llama_token_data_array;
use regex::bytes::{Regex, RegexBuilder};

use crate::errors::{shim_error, Error, Result};
use crate::model::PyLlamaModel;
use crate::sampler::custom::{into_sampler, RustSampler};
use crate::sampler::refuse_unfinished_end;

/// The longest trigger pattern accepted, in bytes.
const MAX_PATTERN_BYTES: usize = 1024;
/// How far back from the newest text a trigger may start: each token searches this much.
pub const SEARCH_WINDOW: usize = 16 * 1024;
/// The longest token piece a trigger may start inside (llama.cpp's replay pattern counts
/// bytes up to it).
const MAX_OFFSET_IN_PIECE: usize = 1024;

/// `ValueError` for a trigger pattern the `regex` crate cannot compile. Patterns are matched
/// byte-wise with ASCII classes, as `std::regex` does; look-around and back-references, which
/// only a backtracking engine has, are refused.
pub fn compile(pattern: &str) -> Result<Regex> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(Error::value(format!(
            "a trigger pattern may hold at most {MAX_PATTERN_BYTES} bytes, got {}",
            pattern.len()
        )));
    }
    RegexBuilder::new(pattern)
        .unicode(false)
        .nest_limit(32)
        .build()
        .map_err(|err| Error::value(format!("trigger pattern {pattern:?}: {err}")))
}

/// Where a trigger found in `text` makes the grammar start, as llama.cpp reckons it: at the
/// first capture group that matched something, else at the match.
fn trigger_start(patterns: &[Regex], text: &[u8]) -> Option<usize> {
    let from = text.len().saturating_sub(SEARCH_WINDOW);
    patterns.iter().find_map(|pattern| {
        let found = pattern.captures_at(text, from)?;
        let group = found.iter().skip(1).flatten().find(|group| !group.is_empty());
        group.or_else(|| found.get(0)).map(|m| m.start())
    })
}

/// What the grammar is built from, shared by every copy.
struct Spec {
    model: Arc<LlamaModel>,
    grammar: String,
    root: String,
    patterns: Vec<Regex>,
    trigger_tokens: Vec<LlamaToken>,
}

enum State {
    /// No trigger yet: the text accepted so far, and each token with the offset its piece
    /// ends at.
    Awaiting {
        text: Vec<u8>,
        tokens: Vec<(LlamaToken, usize)>,
    },
    /// Triggered: llama.cpp's grammar, constraining every later token. It is held as the one
    /// stage of a chain, the only way the crate lends a sampler's raw pointer (for `apply`).
    Triggered(LlamaSampler),
}

struct LazyGrammar {
    spec: Arc<Spec>,
    state: State,
}

fn awaiting() -> State {
    State::Awaiting {
        text: Vec::new(),
        tokens: Vec::new(),
    }
}

/// Builds a lazy grammar; the grammar is parsed once here, so a bad one fails now.
pub fn new(
    model: Arc<LlamaModel>,
    grammar: String,
    root: String,
    patterns: &[String],
    trigger_tokens: Vec<LlamaToken>,
) -> Result<LlamaSampler> {
    let patterns = patterns.iter().map(|pattern| compile(pattern)).collect::<Result<_>>()?;
    LlamaSampler::try_grammar(&model, &grammar, &root)?;
    let spec = Arc::new(Spec {
        model,
        grammar,
        root,
        patterns,
        trigger_tokens,
    });
    Ok(into_sampler(Box::new(LazyGrammar {
        spec,
        state: awaiting(),
    })))
}

impl LazyGrammar {
    fn accept(&mut self, token: LlamaToken) -> Result<()> {
        let spec = Arc::clone(&self.spec);
        match &mut self.state {
            State::Triggered(grammar) => forward(&spec, grammar, token),
            State::Awaiting { .. } if spec.trigger_tokens.contains(&token) => {
                let mut grammar = fresh(&spec)?;
                forward(&spec, &mut grammar, token)?;
                self.state = State::Triggered(grammar);
                Ok(())
            }
            State::Awaiting { text, tokens } => {
                let piece = PyLlamaModel::piece(&spec.model, token.0, true)?;
                text.extend_from_slice(&piece);
                tokens.push((token, text.len()));
                match trigger_start(&spec.patterns, text) {
                    Some(start) => {
                        let grammar = replay(&spec, tokens, start)?;
                        self.state = State::Triggered(grammar);
                        Ok(())
                    }
                    None => Ok(()),
                }
            }
        }
    }
}

/// llama.cpp's grammar, parsed again (it parsed when the lazy grammar was built).
fn fresh(spec: &Spec) -> Result<LlamaSampler> {
    let grammar = LlamaSampler::try_grammar(&spec.model, &spec.grammar, &spec.root)?;
    Ok(LlamaSampler::chain_simple([grammar]))
}

/// llama.cpp's grammar, having accepted `text[start..]` (the tokens that overlap it; the first
/// may be cut). llama.cpp can only cut a token through a trigger pattern of its own lazy
/// grammar, so it gets one that matches at that offset of the first token's piece.
fn replay(spec: &Spec, tokens: &[(LlamaToken, usize)], start: usize) -> Result<LlamaSampler> {
    let first = tokens.iter().position(|&(_, end)| end > start);
    let Some(first) = first else {
        // The trigger matched nothing at the very end: the grammar starts from scratch.
        return fresh(spec);
    };
    let piece_start = first.checked_sub(1).map_or(0, |previous| tokens[previous].1);
    let offset = start - piece_start;
    if offset > MAX_OFFSET_IN_PIECE {
        return Err(Error::value(format!(
            "a trigger starts {offset} bytes into a token's piece; at most {MAX_OFFSET_IN_PIECE} are supported"
        )));
    }
    let cut = format!("^[\\s\\S]{{{offset}}}([\\s\\S])");
    let grammar =
        LlamaSampler::try_grammar_lazy_patterns(&spec.model, &spec.grammar, &spec.root, &[cut.as_str()], &[])?;
    let mut grammar = LlamaSampler::chain_simple([grammar]);
    tokens[first..]
        .iter()
        .try_for_each(|&(token, _)| forward(spec, &mut grammar, token))?;
    Ok(grammar)
}

/// Accepts `token` into llama.cpp's grammar, refusing an end-of-generation token the grammar
/// cannot end on (llama.cpp aborts the process on one).
fn forward(spec: &Spec, grammar: &mut LlamaSampler, token: LlamaToken) -> Result<()> {
    refuse_unfinished_end(spec.model.is_eog_token(token), grammar, token)?;
    grammar.try_accept(token).map_err(shim_error)
}

impl RustSampler for LazyGrammar {
    fn name(&self) -> &'static CStr {
        c"grammar"
    }

    fn accept(&mut self, token: LlamaToken) -> Result<()> {
        LazyGrammar::accept(self, token)
    }

    fn apply(&mut self, candidates: &mut llama_token_data_array) {
        if let State::Triggered(chain) = &self.state {
            // SAFETY: the chain holds exactly one stage and outlives the call; `candidates` is
            // the live array llama.cpp hands to every stage, which the grammar masks in place.
            unsafe { llama_cpp_sys_4::llama_sampler_apply(chain.chain_get_ptr(0), candidates) };
        }
    }

    fn reset(&mut self) -> Result<()> {
        self.state = awaiting();
        Ok(())
    }

    fn copy(&self) -> Result<Box<dyn RustSampler>> {
        let state = match &self.state {
            State::Awaiting { text, tokens } => State::Awaiting {
                text: text.clone(),
                tokens: tokens.clone(),
            },
            State::Triggered(grammar) => State::Triggered(grammar.clone_sampler()),
        };
        Ok(Box::new(LazyGrammar {
            spec: Arc::clone(&self.spec),
            state,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_compile_bytewise_and_refuse_backtracking_only_syntax() {
        assert!(compile(r"^\s*<tool_call>[\s\S]*").is_ok());
        assert!(compile("([").is_err());
        assert!(compile(r"(?=a)b").is_err());
        assert!(compile(r"(a)\1").is_err());
        assert!(compile(&format!("{}a{}", "(".repeat(40), ")".repeat(40))).is_err());
        assert!(compile(&"a".repeat(2000)).is_err());
    }

    #[test]
    fn the_start_is_the_first_group_that_matched_else_the_match() {
        let patterns = [compile(r"x(y)?(z)").unwrap()];
        assert_eq!(trigger_start(&patterns, b"..xz"), Some(3));
        assert_eq!(trigger_start(&patterns, b"..xyz"), Some(3));
        let patterns = [compile(r"tool").unwrap()];
        assert_eq!(trigger_start(&patterns, b"a tool"), Some(2));
        assert_eq!(trigger_start(&patterns, b"a too"), None);
        let anchored = [compile(r"^tool").unwrap()];
        let long = [b"x".repeat(SEARCH_WINDOW * 2), b"tool".to_vec()].concat();
        assert_eq!(trigger_start(&anchored, &long), None);
    }
}
