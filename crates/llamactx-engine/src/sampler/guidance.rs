//! Structured output through llguidance: a JSON Schema, a Lark grammar or a regex, compiled
//! against the model's own vocabulary and applied as a llama.cpp sampler stage that masks every
//! token the constraint cannot take next.
//!
//! It fails closed: a constraint llguidance cannot compile (or that admits no output) is refused
//! before anything is decoded, and one that fails while generating masks every token and reports
//! why, so no unconstrained token is ever sampled.

use std::ffi::CStr;
use std::sync::Arc;

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::sampling::LlamaSampler;
use llama_cpp_4::token::LlamaToken;
use llama_cpp_sys_4::{llama_token, llama_token_data_array};
use llguidance::api::TopLevelGrammar;
use llguidance::Matcher;
use serde_json::Value;
use toktrie::{SimpleVob, TokenId};

use crate::errors::{Error, ExcClass, Result};
use crate::sampler::custom::{self, candidates_of, into_sampler, RustSampler};

pub mod gbnf;
pub mod vocabulary;

/// What a constraint is written in: llama.cpp's own llguidance sampler's names, and GBNF
/// (translated to Lark, `gbnf.rs`, so that its work per step is bounded).
pub const KINDS: [&str; 4] = ["json_schema", "lark", "regex", "gbnf"];

/// The JSON layout a schema's output takes unless the schema's own `x-guidance` sets one of
/// `LAYOUT_KEYS`: no optional whitespace (a small model can otherwise fill its budget with
/// newlines), and the separators models write themselves.
const JSON_LAYOUT: &str = r#"{"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}"#;
/// The `x-guidance` options that choose the layout; the others (`lenient`, `coerce_one_of`, ...)
/// keep `JSON_LAYOUT`.
const LAYOUT_KEYS: [&str; 4] = [
    "whitespace_flexible",
    "whitespace_pattern",
    "item_separator",
    "key_separator",
];

/// `SchemaError` (a `ValueError`) of kind `kind`.
pub fn schema_error(kind: &'static str, message: impl Into<String>) -> Error {
    Error::llama(ExcClass::SchemaError, kind, None, message)
}

/// A sampler stage constraining output to `data`, a constraint of kind `kind` (one of
/// `KINDS`). `SchemaError` when llguidance cannot compile it or it admits no output.
pub fn new(model: &Arc<LlamaModel>, kind: &str, data: &str) -> Result<LlamaSampler> {
    let guidance = compiled(model, kind, data, "root")?;
    Ok(into_sampler(Box::new(guidance)))
}

/// The GBNF `text` from its rule `root`, compiled: the constraint itself, for the samplers that
/// hold one (lazy grammars, a template's tool-call grammar). `SamplerInitError` for GBNF that
/// llama.cpp would not parse either.
pub fn gbnf(model: &Arc<LlamaModel>, text: &str, root: &str) -> Result<Guidance> {
    compiled(model, "gbnf", text, root)
}

fn compiled(model: &Arc<LlamaModel>, kind: &str, data: &str, gbnf_root: &str) -> Result<Guidance> {
    let grammar = grammar(kind, data, gbnf_root)?;
    let vocabulary = vocabulary::indexed(model)?;
    on_compile_stack(|| compile(&vocabulary, grammar, kind))
}

/// The stack a constraint compiles on. llguidance's compilers recurse once per `$ref` followed
/// and per chained Lark rule (measured: under 5 KiB a Lark rule, under 8 KiB a `$ref`; nesting
/// within a rule or a JSON value is bounded by llguidance and serde_json), and
/// `MAX_CONSTRAINT_LINKS` bounds how many of those a constraint holds: at most 160 MiB of this
/// stack, which is reserved and touched only as deep as the recursion goes.
const COMPILE_STACK_BYTES: usize = 512 << 20;

/// The most `$ref`s, and for Lark lines (each rule starts one), in a constraint.
const MAX_CONSTRAINT_LINKS: usize = 20_000;

/// The longest constraint text compiled (a server's whole body is 4 MiB by default).
const MAX_CONSTRAINT_BYTES: usize = 4 << 20;

/// Runs `compile` on a thread of its own with `COMPILE_STACK_BYTES` of stack, whatever the
/// caller's thread (Python's main thread, an event loop's, the engine's).
fn on_compile_stack<T: Send>(compile: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("llamactx-constraint".to_owned())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn_scoped(scope, compile)
            .map_err(|err| Error::Runtime(format!("could not start a thread to compile the constraint: {err}")))?
            .join()
            .map_err(|_| schema_error("Failed", "llguidance panicked while compiling the constraint"))?
    })
}

fn compile(vocabulary: &vocabulary::Indexed, grammar: TopLevelGrammar, kind: &str) -> Result<Guidance> {
    let parser = vocabulary
        .factory
        .create_parser(grammar)
        .map_err(|err| schema_error("Unsupported", format!("llguidance cannot compile this {kind}: {err}")))?;
    let matcher = Matcher::new(Ok(parser));
    let mut guidance = Guidance {
        start: matcher.clone(),
        matcher,
        ends: Arc::clone(&vocabulary.ends),
        mask: None,
    };
    let first = guidance.mask().map_err(|err| {
        schema_error(
            "Unsatisfiable",
            format!(
                "llguidance finds no way to start this {kind} ({err}); references that only lead back to \
                 themselves, such as {{\"$ref\": \"#\"}}, admit no value"
            ),
        )
    })?;
    if first.is_zero() {
        return Err(schema_error("Unsatisfiable", format!("this {kind} admits no output")));
    }
    guidance.mask = Some(first);
    Ok(guidance)
}

/// `SchemaError` (kind `TooLarge`) for a constraint of `kind` too large to compile: longer than
/// `MAX_CONSTRAINT_BYTES`, or with more than `MAX_CONSTRAINT_LINKS` references and rules. Cheap
/// (one pass over the text): every other check of a constraint comes after it.
pub fn check_size(kind: &str, data: &str) -> Result<()> {
    if data.len() > MAX_CONSTRAINT_BYTES {
        return Err(schema_error(
            "TooLarge",
            format!(
                "the {kind} has {} bytes; at most {MAX_CONSTRAINT_BYTES} are compiled",
                data.len()
            ),
        ));
    }
    let links = data.matches("$ref").count()
        + if matches!(kind, "lark" | "gbnf") {
            data.lines().count()
        } else {
            0
        };
    if links > MAX_CONSTRAINT_LINKS {
        return Err(schema_error(
            "TooLarge",
            format!(
                "the {kind} has {links} references and rules; at most {MAX_CONSTRAINT_LINKS} are compiled (each \
                 can be a level of llguidance's recursion)"
            ),
        ));
    }
    Ok(())
}

fn grammar(kind: &str, data: &str, gbnf_root: &str) -> Result<TopLevelGrammar> {
    check_size(kind, data)?;
    match kind {
        "json_schema" => {
            let schema: Value = serde_json::from_str(data)
                .map_err(|err| schema_error("InvalidJson", format!("the schema is not JSON: {err}")))?;
            Ok(TopLevelGrammar::from_json_schema(with_layout(schema)?))
        }
        "lark" => Ok(TopLevelGrammar::from_lark(data.to_owned())),
        "regex" => Ok(TopLevelGrammar::from_regex(data)),
        "gbnf" => gbnf::to_lark(data, gbnf_root)
            .map(TopLevelGrammar::from_lark)
            .map_err(|reason| {
                Error::llama(
                    ExcClass::SamplerInitError,
                    "InvalidGrammar",
                    None,
                    format!("the GBNF grammar does not parse: {reason}"),
                )
            }),
        _ => Err(Error::value(format!(
            "constraint kind must be one of {KINDS:?}, got {kind:?}"
        ))),
    }
}

fn with_layout(schema: Value) -> Result<Value> {
    match schema {
        Value::Object(mut fields) => {
            let options = fields
                .entry("x-guidance")
                .or_insert_with(|| Value::Object(serde_json::Map::new()));
            // Options that are not an object are left for llguidance to refuse.
            if let Value::Object(options) = options {
                if !LAYOUT_KEYS.iter().any(|key| options.contains_key(*key)) {
                    let layout: serde_json::Map<String, Value> =
                        serde_json::from_str(JSON_LAYOUT).map_err(|err| Error::Panic(err.to_string()))?;
                    options.extend(layout);
                }
            }
            Ok(Value::Object(fields))
        }
        Value::Bool(_) => Ok(schema),
        _ => Err(schema_error("InvalidSchema", "a JSON Schema is an object or a boolean")),
    }
}

/// An llguidance error's message without the parser state it dumps after it.
fn first_line(err: impl std::fmt::Display) -> String {
    let message = err.to_string();
    message.lines().next().unwrap_or_default().to_owned()
}

/// One constrained generation's state.
#[derive(Clone)]
pub struct Guidance {
    /// The matcher before any token: `reset` starts from a copy (a matcher that refused a
    /// token stays in its error state).
    start: Matcher,
    matcher: Matcher,
    /// llguidance's end of sequence first, then the model's other end-of-generation tokens,
    /// which stand for it.
    ends: Arc<[TokenId]>,
    /// The mask for the tokens accepted so far, once computed.
    mask: Option<SimpleVob>,
}

impl Guidance {
    fn mask(&mut self) -> std::result::Result<SimpleVob, String> {
        self.matcher.compute_mask_or_eos().map_err(first_line)
    }

    /// Moves the constraint past `text`, as if it had been generated: the text a lazy grammar's
    /// trigger started, or the generation prompt a template wrote. It is split into tokens
    /// greedily; any split serves, since llguidance matches bytes whatever the tokens.
    /// `SchemaError` kind `Refused` when the constraint cannot start with `text`.
    pub fn advance(&mut self, text: &[u8]) -> Result<()> {
        self.mask = None;
        let refused = |why: String| {
            schema_error(
                "Refused",
                format!(
                    "the constraint cannot start with {:?}: {why}",
                    String::from_utf8_lossy(text)
                ),
            )
        };
        let env = self.matcher.tok_env().map_err(|err| refused(first_line(err)))?;
        let trie = env.tok_trie();
        let tokens = trie.greedy_tokenize(text);
        // The split skips a byte that no token spells; the constraint must not skip it.
        if trie.decode_raw(&tokens) != text {
            return Err(refused("the vocabulary cannot spell it".to_owned()));
        }
        self.matcher
            .consume_tokens(&tokens)
            .map_err(|err| refused(first_line(err)))
    }

    fn allows(&self, mask: &SimpleVob, token: TokenId) -> bool {
        (token as usize) < mask.len()
            && (mask.is_allowed(token) || (self.ends.contains(&token) && mask.is_allowed(self.ends[0])))
    }

    /// Masks the candidates the constraint cannot take; all of them when it failed.
    fn apply(&mut self, candidates: &mut [llama_cpp_sys_4::llama_token_data]) {
        if self.mask.is_none() {
            match self.mask() {
                Ok(mask) => self.mask = Some(mask),
                Err(err) => custom::record(schema_error("Failed", format!("the constraint failed: {err}"))),
            }
        }
        let mask = self.mask.as_ref();
        for candidate in candidates {
            let allowed = TokenId::try_from(candidate.id)
                .ok()
                .zip(mask)
                .is_some_and(|(token, mask)| self.allows(mask, token));
            if !allowed {
                candidate.logit = f32::NEG_INFINITY;
            }
        }
    }

    fn accept(&mut self, token: llama_token) -> Result<()> {
        self.mask = None;
        let refused = format!("token {token} does not follow the constraint here");
        let token = TokenId::try_from(token).map_err(|_| schema_error("Refused", refused.clone()))?;
        let token = if self.ends.contains(&token) {
            self.ends[0]
        } else {
            token
        };
        if token == self.ends[0] && self.matcher.is_stopped() && !self.matcher.is_error() {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|err| schema_error("Refused", format!("{refused}: {}", first_line(err))))
    }
}

impl RustSampler for Guidance {
    fn name(&self) -> &'static CStr {
        c"llguidance"
    }

    fn accept(&mut self, token: LlamaToken) -> Result<()> {
        Guidance::accept(self, token.0)
    }

    fn apply(&mut self, candidates: &mut llama_token_data_array) {
        Guidance::apply(self, candidates_of(candidates));
    }

    fn reset(&mut self) -> Result<()> {
        self.mask = None;
        self.matcher = self.start.clone();
        Ok(())
    }

    fn prepare(&mut self) {
        if self.mask.is_none() {
            self.mask = self.mask().ok();
        }
    }

    fn copy(&self) -> Result<Box<dyn RustSampler>> {
        Ok(Box::new(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_get_the_compact_layout_unless_they_choose_their_own() {
        let layout: Value = serde_json::from_str(JSON_LAYOUT).unwrap();
        let schema = with_layout(serde_json::json!({"type": "object"})).unwrap();
        assert_eq!(schema["x-guidance"], layout);
        let own = serde_json::json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(with_layout(own.clone()).unwrap(), own);
        let lenient = with_layout(serde_json::json!({"x-guidance": {"lenient": true}})).unwrap();
        let mut expected = layout.clone();
        expected["lenient"] = Value::Bool(true);
        assert_eq!(lenient["x-guidance"], expected);
        assert_eq!(with_layout(Value::Bool(true)).unwrap(), Value::Bool(true));
        assert!(with_layout(serde_json::json!([1])).is_err());
    }

    #[test]
    fn kinds_are_llama_cpps_names_and_gbnf_and_json_must_parse() {
        assert!(grammar("json_schema", "{}", "root").is_ok());
        assert!(grammar("lark", "start: \"a\"", "root").is_ok());
        assert!(grammar("regex", "a+", "root").is_ok());
        assert!(grammar("gbnf", "root ::= \"a\"", "root").is_ok());
        assert!(
            matches!(grammar("gbnf", "root ::= x", "root"), Err(Error::Llama { kind, .. }) if kind == "InvalidGrammar")
        );
        assert!(matches!(
            grammar("ebnf", "root ::= \"a\"", "root"),
            Err(Error::Value(_))
        ));
        assert!(matches!(grammar("json_schema", "{", "root"), Err(Error::Llama { kind, .. }) if kind == "InvalidJson"));
    }
}
