//! Lazy grammars: a grammar that constrains tokens only once a trigger has appeared.
//!
//! llama.cpp's own lazy grammar runs its trigger patterns with `std::regex` over all the text
//! accepted so far, once per token: backtracking that is quadratic at best and exponential for
//! some patterns, recursive enough to overflow the stack, and never interruptible. Its grammar
//! engine then keeps one stack per partial parse, unbounded in number for an ambiguous grammar
//! (a template's tool-call grammar is written from a request's tool schemas). This sampler waits
//! for the trigger in Rust, with the `regex` crate (linear time, no recursion), and the grammar
//! is GBNF compiled by llguidance (`guidance::gbnf`), whose work per step is bounded; once
//! triggered it is moved past the text from the trigger on, as llama.cpp's would be
//! [llama.cpp internal].

use std::ffi::CStr;
use std::sync::Arc;

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::token::LlamaToken;
use llama_cpp_sys_4::llama_token_data_array;
use regex::bytes::{Regex, RegexBuilder};

use crate::errors::{Error, Result};
use crate::model::PyLlamaModel;
use crate::sampler::custom::{into_sampler, RustSampler};
use crate::sampler::guidance::{self, Guidance};

/// The longest trigger pattern accepted, in bytes.
const MAX_PATTERN_BYTES: usize = 1024;
/// How far back from the newest text a trigger may start: each token searches this much.
pub const SEARCH_WINDOW: usize = 16 * 1024;

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

/// What every copy shares: the triggers, and the grammar compiled before any text.
struct Spec {
    model: Arc<LlamaModel>,
    grammar: Guidance,
    patterns: Vec<Regex>,
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
                let piece = PyLlamaModel::piece(&spec.model, token.0, true)?;
                self.trigger(&piece)
            }
            State::Awaiting(text) => {
                text.extend_from_slice(&PyLlamaModel::piece(&spec.model, token.0, true)?);
                match trigger_start(&spec.patterns, text) {
                    Some(start) => {
                        let triggering = text.split_off(start);
                        self.trigger(&triggering)
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
