//! A model's chat template, through the crate's `chat` module (llama.cpp's Jinja engine and its
//! format analysis): the prompt, with the messages' text marked so that it is tokenized as plain
//! text, and, for a template with its own tool-call format, the tools as the template shows
//! them, the grammar (lazy, with its triggers) that keeps a call well-formed, and the parser
//! that turns the output back into OpenAI's message.

use std::sync::Arc;

use llama_cpp_4::chat::{ChatApplyParams, ChatParams, ChatTemplates, PromptPart, ReasoningFormat, ToolChoice};
use llama_cpp_4::common_sampler::{ReasoningBudget, ReasoningBudgetState};
use llama_cpp_4::model::{AddBos, LlamaModel, Special};
use llama_cpp_4::sampling::LlamaSampler;
use llama_cpp_4::token::LlamaToken;
use pyo3::prelude::*;

use crate::errors::python::to_py;
use crate::errors::{Error, ExcClass, Result};
use crate::gil::detached;
use crate::model::python::PyLlamaModel;
use crate::sampler::custom::into_sampler;
use crate::sampler::python::PyLlamaSampler;
use crate::sampler::{guidance, lazy_grammar};
use crate::work_limit;

/// A model's chat templates, parsed once (internal: the renderer of every chat, see
/// `llamactx._render`).
#[pyclass(frozen, module = "llamactx", name = "_ChatTemplates")]
pub struct PyChatTemplates {
    /// Shared with each render's thread (`work_limit::limited`), which may outlive a call.
    templates: Arc<ChatTemplates>,
    model: Arc<LlamaModel>,
    /// Whether the template renders tools and tool calls (llama.cpp's capability analysis).
    #[pyo3(get)]
    supports_tool_calls: bool,
    /// Whether the template thinks when told to (llama.cpp's analysis): a chat's
    /// `enable_thinking` defaults to it, as in llama-server.
    #[pyo3(get)]
    supports_thinking: bool,
}

#[pymethods]
impl PyChatTemplates {
    /// The templates of `model`, or `template` (Jinja) instead. `ChatTemplateError` when there
    /// is none, it does not parse, or its analysis passes the work limit (`work_limit.rs`).
    #[new]
    #[pyo3(signature = (model, template=None))]
    fn new(py: Python<'_>, model: &Bound<'_, PyLlamaModel>, template: Option<String>) -> PyResult<Self> {
        let model = model.get().tokenizer().map_err(to_py)?;
        detached(py, move || {
            let input_bytes = template.as_ref().map_or(0, String::len);
            let for_call = Arc::clone(&model);
            let (templates, caps, supports_thinking) = work_limit::limited(input_bytes, move || {
                let templates = ChatTemplates::from_model(&for_call, template.as_deref()).map_err(template_error)?;
                let caps = templates.caps_json().map_err(template_error)?;
                let supports_thinking = templates.supports_enable_thinking();
                Ok((Arc::new(templates), caps, supports_thinking))
            })?;
            let caps: serde_json::Value = serde_json::from_str(&caps).unwrap_or_default();
            let supports_tool_calls = caps["supports_tool_calls"].as_bool().unwrap_or(false);
            Ok(Self {
                templates,
                model,
                supports_tool_calls,
                supports_thinking,
            })
        })
    }

    /// Renders `messages` (OpenAI's, as JSON) with `tools` (JSON) for the assistant's reply;
    /// `tool_choice` is "auto", "required" or "none"; `template_kwargs` (a JSON object) are
    /// further variables of the template, llama-server's `chat_template_kwargs` (its
    /// `enable_thinking` also tells llama.cpp whether the reply thinks; without it, the reply
    /// thinks where the template can, `supports_thinking`); `reasoning_format` is
    /// one of llama-server's `--reasoning-format` choices (`_REASONING_FORMATS`): how the parser
    /// hands back the reply's reasoning. `ValueError` for what the template cannot render or an
    /// unknown format; `ChatTemplateError` kind `WorkLimit` when rendering passes the work limit.
    #[pyo3(signature = (messages, tools, tool_choice, parallel_tool_calls, template_kwargs=None, reasoning_format="auto"))]
    #[allow(clippy::too_many_arguments)] // the template's inputs, as llama-server takes them
    fn apply(
        &self,
        py: Python<'_>,
        messages: String,
        tools: String,
        tool_choice: String,
        parallel_tool_calls: bool,
        template_kwargs: Option<String>,
        reasoning_format: &str,
    ) -> PyResult<PyChatApplied> {
        let reasoning_format = reasoning_format_named(reasoning_format).map_err(to_py)?;
        detached(py, || {
            let choice = ToolChoice::parse_oaicompat(&tool_choice).map_err(chat_value_error)?;
            // As llama.cpp's server: a BOS the template writes is dropped from its text, and the
            // tokenizer adds the model's own when the model wants one.
            let input_bytes = messages.len() + tools.len() + template_kwargs.as_ref().map_or(0, String::len);
            let (enable_thinking, kwargs) = match template_kwargs {
                Some(kwargs) => template_variables(&kwargs).map(|(thinking, kwargs)| (thinking, Some(kwargs)))?,
                None => (None, None),
            };
            let mut request = ChatApplyParams::new(messages)
                .with_add_bos_eos(self.model.add_bos_token(), false)
                .with_tools(tools)
                .with_tool_choice(choice)
                .with_parallel_tool_calls(parallel_tool_calls)
                .with_reasoning_format(reasoning_format)
                .with_enable_thinking(enable_thinking.unwrap_or(self.supports_thinking));
            if let Some(kwargs) = kwargs {
                request = request.with_template_kwargs(kwargs);
            }
            let templates = Arc::clone(&self.templates);
            let params = work_limit::limited(input_bytes, move || templates.apply(&request).map_err(chat_value_error))?;
            Ok(PyChatApplied {
                end_tags: end_tags(&params),
                params,
                model: Arc::clone(&self.model),
            })
        })
    }
}

/// A rendered chat: its prompt tokens, the constraint of its reply, and the reply's parser.
#[pyclass(frozen, module = "llamactx", name = "_ChatApplied")]
pub struct PyChatApplied {
    params: ChatParams,
    model: Arc<LlamaModel>,
    /// The tags that close a reasoning block, as llama.cpp lists them (none: no reasoning).
    end_tags: Vec<String>,
}

#[pymethods]
impl PyChatApplied {
    /// The prompt's tokens: special tokens parsed in what the template wrote, never in what
    /// the messages hold (a user cannot forge a turn).
    fn tokens(&self, py: Python<'_>) -> PyResult<Vec<i32>> {
        Ok(self.segments(py, None)?.concat())
    }

    /// The prompt's tokens (as `tokens`) in runs split where `marker` stands in the messages'
    /// text: one run more than markers. The renderer puts a marker no message can contain
    /// where each image goes.
    #[pyo3(signature = (marker = None))]
    fn segments(&self, py: Python<'_>, marker: Option<String>) -> PyResult<Vec<Vec<i32>>> {
        detached(py, || {
            let mut bos = if self.model.add_bos_token() {
                AddBos::Always
            } else {
                AddBos::Never
            };
            let whole = [PromptPart {
                text: self.params.prompt.clone(),
                is_input: false,
            }];
            // Without spans (an old shim) the prompt is one span of the template's, as the crate
            // tokenizes it.
            let parts = if self.params.prompt_parts.is_empty() {
                &whole[..]
            } else {
                &self.params.prompt_parts[..]
            };
            let mut runs = vec![Vec::new()];
            for part in parts {
                let special = if part.is_input {
                    Special::Plaintext
                } else {
                    Special::Tokenize
                };
                let pieces: Vec<&str> = match marker.as_deref().filter(|marker| !marker.is_empty()) {
                    Some(marker) if part.is_input => part.text.split(marker).collect(),
                    _ => vec![part.text.as_str()],
                };
                for (index, piece) in pieces.into_iter().enumerate() {
                    if index > 0 {
                        runs.push(Vec::new());
                    }
                    // An empty span would consume the one-shot BOS without a token.
                    if piece.is_empty() {
                        continue;
                    }
                    let tokens = self.model.str_to_token_with_special(piece, bos, special)?;
                    bos = AddBos::Never;
                    if let Some(run) = runs.last_mut() {
                        run.extend(tokens.into_iter().map(|token| token.0));
                    }
                }
            }
            Ok(runs)
        })
    }

    /// The grammar sampler the reply needs (None: free text): lazy, waiting for its
    /// triggers, or eager and past the generation prompt the template already wrote. The GBNF
    /// llama.cpp writes from the tools' schemas is compiled by llguidance, whose work per token
    /// is bounded, whatever the schemas.
    fn sampler(&self, py: Python<'_>) -> PyResult<Option<PyLlamaSampler>> {
        detached(py, || {
            if self.params.grammar.is_empty() {
                return Ok(None);
            }
            let (patterns, tokens) = self.params.sampler_triggers();
            let sampler = if self.params.grammar_lazy && !(patterns.is_empty() && tokens.is_empty()) {
                lazy_grammar::new(Arc::clone(&self.model), &self.params.grammar, "root", &patterns, tokens)?
            } else {
                self.prefilled()?
            };
            Ok(Some(PyLlamaSampler::for_model(sampler, Arc::clone(&self.model))))
        })
    }

    /// Extra stop strings the format needs.
    fn additional_stops(&self) -> Vec<String> {
        serde_json::from_str(&self.params.additional_stops_json).unwrap_or_default()
    }

    /// OpenAI's assistant message (JSON text: `content`, `tool_calls` without ids,
    /// `reasoning_content`) for the generated `text`; `partial` for a reply still being
    /// generated (a tag cut short is held back, not shown). `ValueError` when it does not
    /// follow the format.
    #[pyo3(signature = (text, partial = false))]
    fn parse(&self, py: Python<'_>, text: String, partial: bool) -> PyResult<String> {
        detached(py, || self.params.parse(&text, partial).map_err(chat_value_error))
    }

    /// Whether the template's replies open a reasoning block llama.cpp knows the tags of (the
    /// parser then splits it out, and `reasoning_budget` can bound it).
    #[getter]
    fn reasons(&self) -> bool {
        self.params.supports_thinking && !self.params.thinking_start_tag.is_empty() && !self.end_tags.is_empty()
    }

    /// llama.cpp's reasoning-budget sampler stage for this reply (None where the template does
    /// not reason): after `budget` tokens of reasoning it forces `message` and the block's
    /// closing tag, token by token. A block the template's generation prompt opens counts from
    /// the reply's first token. `ValueError` for a budget below 0.
    #[pyo3(signature = (budget, message = ""))]
    fn reasoning_budget(&self, py: Python<'_>, budget: i32, message: &str) -> PyResult<Option<PyLlamaSampler>> {
        checked_budget(budget).map_err(to_py)?;
        if !self.reasons() {
            return Ok(None);
        }
        detached(py, || {
            let tokens = |text: &str| -> Result<Vec<LlamaToken>> {
                Ok(self
                    .model
                    .str_to_token_with_special(text, AddBos::Never, Special::Tokenize)?)
            };
            let ends: Vec<Vec<LlamaToken>> = self.end_tags.iter().map(|tag| tokens(tag)).collect::<Result<_>>()?;
            let first_end = self.end_tags.first().map_or("", String::as_str);
            let forced = tokens(&format!("{message}{first_end}"))?;
            let starts = [tokens(&self.params.thinking_start_tag)?];
            // Told, not fed the prompt's tokens: fed them, the sampler would count (or, for a
            // budget of 0, skip forced tokens for) what follows the opening tag in the prompt.
            let initial = if self.opens_block() {
                ReasoningBudgetState::Counting
            } else {
                ReasoningBudgetState::Idle
            };
            let stage = ReasoningBudget::with_initial_state(&self.model, &starts, &ends, &forced, budget, initial)
                .map_err(|err| Error::value(format!("the reasoning budget cannot be set up: {err}")))?
                .into_sampler();
            Ok(Some(PyLlamaSampler::for_model(stage, Arc::clone(&self.model))))
        })
    }
}

impl PyChatApplied {
    /// Whether the generation prompt leaves a reasoning block open (its last opening tag has
    /// no closing tag after it): the reply then starts inside the block.
    fn opens_block(&self) -> bool {
        let prompt = self.params.generation_prompt();
        prompt
            .rfind(self.params.thinking_start_tag.as_str())
            .is_some_and(|start| {
                let after = &prompt[start + self.params.thinking_start_tag.len()..];
                !self.end_tags.iter().any(|tag| after.contains(tag.as_str()))
            })
    }

    /// The eager grammar, past the generation prompt: llama.cpp's tool-call grammars match
    /// `generation prompt + output`, as its parser reads them [llama.cpp internal].
    fn prefilled(&self) -> Result<LlamaSampler> {
        let mut grammar = guidance::gbnf(&self.model, &self.params.grammar, "root")?;
        grammar.advance(self.params.generation_prompt().as_bytes())?;
        Ok(into_sampler(Box::new(grammar)))
    }
}

/// The tags that close a reasoning block in `params`, as llama.cpp lists them.
fn end_tags(params: &ChatParams) -> Vec<String> {
    serde_json::from_str::<Vec<String>>(&params.thinking_end_tags_json)
        .unwrap_or_default()
        .into_iter()
        .filter(|tag| !tag.is_empty())
        .collect()
}

/// The check `apply` makes of `kwargs` (JSON text), alone: the renderer makes it first, so that
/// what it refuses is known to be the template variables' fault. `ValueError` as `apply`'s.
#[pyfunction]
#[pyo3(name = "_check_template_variables")]
pub fn check_template_variables(kwargs: &str) -> PyResult<()> {
    template_variables(kwargs).map_err(to_py)?;
    Ok(())
}

/// `kwargs` (`chat_template_kwargs`, which must be a JSON object) as the crate's shim takes
/// them, and whether they turn thinking on or off (their `enable_thinking`, a boolean; None
/// when they do not say). The shim hands a string value to llama.cpp as the JSON text of the value, which
/// llama.cpp parses again, so each string goes as its own JSON encoding [llama.cpp internal].
fn template_variables(kwargs: &str) -> Result<(Option<bool>, String)> {
    let mut object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(kwargs)
        .map_err(|err| Error::value(format!("chat_template_kwargs must be a JSON object: {err}")))?;
    let enable_thinking = match object.get("enable_thinking") {
        None => None,
        Some(serde_json::Value::Bool(enabled)) => Some(*enabled),
        Some(other) => {
            return Err(Error::value(format!(
                "chat_template_kwargs' enable_thinking must be true or false, got {other}"
            )))
        }
    };
    for value in object.values_mut() {
        if value.is_string() {
            *value = serde_json::Value::String(value.to_string());
        }
    }
    Ok((enable_thinking, serde_json::Value::Object(object).to_string()))
}

/// llama-server's `--reasoning-format` choices, by name.
const REASONING_FORMATS: [(&str, ReasoningFormat); 4] = [
    ("none", ReasoningFormat::None),
    ("auto", ReasoningFormat::Auto),
    ("deepseek", ReasoningFormat::DeepSeek),
    ("deepseek-legacy", ReasoningFormat::DeepSeekLegacy),
];

/// The names of `REASONING_FORMATS`, for Python.
pub fn reasoning_format_names() -> Vec<&'static str> {
    REASONING_FORMATS.iter().map(|(name, _)| *name).collect()
}

/// The format named `name` (`REASONING_FORMATS`).
fn reasoning_format_named(name: &str) -> Result<ReasoningFormat> {
    REASONING_FORMATS
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, format)| *format)
        .ok_or_else(|| {
            Error::value(format!(
                "reasoning_format must be one of {:?}, got {name:?}",
                reasoning_format_names()
            ))
        })
}

/// The checks of `llamactx.Reasoning`'s `format` and `budget`, which `apply` and
/// `reasoning_budget` make again: `ValueError` for an unknown format or a budget below 0.
#[pyfunction]
#[pyo3(name = "_check_reasoning")]
pub fn check_reasoning(format: &str, budget: Option<i32>) -> PyResult<()> {
    reasoning_format_named(format).map_err(to_py)?;
    if let Some(budget) = budget {
        checked_budget(budget).map_err(to_py)?;
    }
    Ok(())
}

fn checked_budget(budget: i32) -> Result<()> {
    if budget < 0 {
        return Err(Error::value(format!(
            "a reasoning budget must be at least 0 tokens, got {budget}"
        )));
    }
    Ok(())
}

fn template_error(err: impl std::fmt::Display) -> Error {
    Error::llama(ExcClass::ChatTemplateError, "Init", None, err.to_string())
}

fn chat_value_error(err: impl std::fmt::Display) -> Error {
    Error::value(format!("the chat template cannot render this: {err}"))
}

#[cfg(test)]
mod tests {
    use super::{checked_budget, reasoning_format_named, reasoning_format_names, template_variables};
    use llama_cpp_4::chat::ReasoningFormat;

    #[test]
    fn reasoning_formats_are_llama_servers_names() {
        assert_eq!(
            reasoning_format_names(),
            ["none", "auto", "deepseek", "deepseek-legacy"]
        );
        let formats: Vec<ReasoningFormat> = reasoning_format_names()
            .iter()
            .map(|name| reasoning_format_named(name).unwrap())
            .collect();
        assert_eq!(
            formats,
            [
                ReasoningFormat::None,
                ReasoningFormat::Auto,
                ReasoningFormat::DeepSeek,
                ReasoningFormat::DeepSeekLegacy
            ]
        );
        assert!(reasoning_format_named("deepseek_legacy").is_err());
        assert!(checked_budget(0).is_ok());
        assert!(checked_budget(-1).is_err());
    }

    #[test]
    fn strings_go_as_their_json_text_and_enable_thinking_is_read() {
        let (thinking, kwargs) = template_variables(r#"{"greeting": "Be \"brief\".", "n": 2}"#).unwrap();
        assert_eq!(thinking, None);
        let value: serde_json::Value = serde_json::from_str(&kwargs).unwrap();
        assert_eq!(value["greeting"], r#""Be \"brief\".""#);
        assert_eq!(value["n"], 2);
        assert_eq!(
            template_variables(r#"{"enable_thinking": false}"#).unwrap().0,
            Some(false)
        );
        assert!(template_variables(r#"{"enable_thinking": "no"}"#).is_err());
        assert!(template_variables("[1]").is_err());
    }
}
