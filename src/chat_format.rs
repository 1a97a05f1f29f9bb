//! A model's chat template, through the crate's `chat` module (llama.cpp's Jinja engine and its
//! format analysis): the prompt, with the messages' text marked so that it is tokenized as plain
//! text, and, for a template with its own tool-call format, the tools as the template shows
//! them, the grammar (lazy, with its triggers) that keeps a call well-formed, and the parser
//! that turns the output back into OpenAI's message.

use std::sync::Arc;

use llama_cpp_4::chat::{ChatApplyParams, ChatParams, ChatTemplates, PromptPart, ToolChoice};
use llama_cpp_4::model::{AddBos, LlamaModel, Special};
use llama_cpp_4::sampling::LlamaSampler;
use pyo3::prelude::*;

use crate::errors::{Error, ExcClass, Result};
use crate::gil::detached;
use crate::model::PyLlamaModel;
use crate::sampler::custom::into_sampler;
use crate::sampler::{guidance, lazy_grammar, PyLlamaSampler};
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
}

#[pymethods]
impl PyChatTemplates {
    /// The templates of `model`, or `template` (Jinja) instead. `ChatTemplateError` when there
    /// is none, it does not parse, or its analysis passes the work limit (`work_limit.rs`).
    #[new]
    #[pyo3(signature = (model, template=None))]
    fn new(py: Python<'_>, model: &Bound<'_, PyLlamaModel>, template: Option<String>) -> PyResult<Self> {
        let model = model.get().tokenizer()?;
        detached(py, move || {
            let input_bytes = template.as_ref().map_or(0, String::len);
            let for_call = Arc::clone(&model);
            let (templates, caps) = work_limit::limited(input_bytes, move || {
                let templates = ChatTemplates::from_model(&for_call, template.as_deref()).map_err(template_error)?;
                let caps = templates.caps_json().map_err(template_error)?;
                Ok((Arc::new(templates), caps))
            })?;
            let caps: serde_json::Value = serde_json::from_str(&caps).unwrap_or_default();
            let supports_tool_calls = caps["supports_tool_calls"].as_bool().unwrap_or(false);
            Ok(Self {
                templates,
                model,
                supports_tool_calls,
            })
        })
    }

    /// Renders `messages` (OpenAI's, as JSON) with `tools` (JSON) for the assistant's reply;
    /// `tool_choice` is "auto", "required" or "none"; `template_kwargs` (a JSON object) are
    /// further variables of the template, llama-server's `chat_template_kwargs` (its
    /// `enable_thinking` also tells llama.cpp whether the reply thinks). `ValueError` for what
    /// the template cannot render; `ChatTemplateError` kind `WorkLimit` when rendering passes
    /// the work limit.
    #[pyo3(signature = (messages, tools, tool_choice, parallel_tool_calls, template_kwargs=None))]
    fn apply(
        &self,
        py: Python<'_>,
        messages: String,
        tools: String,
        tool_choice: String,
        parallel_tool_calls: bool,
        template_kwargs: Option<String>,
    ) -> PyResult<PyChatApplied> {
        detached(py, || {
            let choice = ToolChoice::parse_oaicompat(&tool_choice).map_err(chat_value_error)?;
            // As llama.cpp's server: a BOS the template writes is dropped from its text, and the
            // tokenizer adds the model's own when the model wants one.
            let input_bytes = messages.len() + tools.len() + template_kwargs.as_ref().map_or(0, String::len);
            let mut request = ChatApplyParams::new(messages)
                .with_add_bos_eos(self.model.add_bos_token(), false)
                .with_tools(tools)
                .with_tool_choice(choice)
                .with_parallel_tool_calls(parallel_tool_calls);
            if let Some(kwargs) = template_kwargs {
                let (enable_thinking, kwargs) = template_variables(&kwargs)?;
                request = request
                    .with_enable_thinking(enable_thinking)
                    .with_template_kwargs(kwargs);
            }
            let templates = Arc::clone(&self.templates);
            let params = work_limit::limited(input_bytes, move || templates.apply(&request).map_err(chat_value_error))?;
            Ok(PyChatApplied {
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
    /// `reasoning_content`) for the generated `text`. `ValueError` when it does not follow
    /// the format.
    fn parse(&self, py: Python<'_>, text: String) -> PyResult<String> {
        detached(py, || self.params.parse(&text, false).map_err(chat_value_error))
    }
}

impl PyChatApplied {
    /// The eager grammar, past the generation prompt: llama.cpp's tool-call grammars match
    /// `generation prompt + output`, as its parser reads them [llama.cpp internal].
    fn prefilled(&self) -> Result<LlamaSampler> {
        let mut grammar = guidance::gbnf(&self.model, &self.params.grammar, "root")?;
        grammar.advance(self.params.generation_prompt().as_bytes())?;
        Ok(into_sampler(Box::new(grammar)))
    }
}

/// `kwargs` (`chat_template_kwargs`, which must be a JSON object) as the crate's shim takes
/// them, and whether they leave thinking on (their `enable_thinking`, a boolean; else true, as
/// in llama.cpp). The shim hands a string value to llama.cpp as the JSON text of the value, which
/// llama.cpp parses again, so each string goes as its own JSON encoding [llama.cpp internal].
fn template_variables(kwargs: &str) -> Result<(bool, String)> {
    let mut object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(kwargs)
        .map_err(|err| Error::value(format!("chat_template_kwargs must be a JSON object: {err}")))?;
    let enable_thinking = match object.get("enable_thinking") {
        None => true,
        Some(serde_json::Value::Bool(enabled)) => *enabled,
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

fn template_error(err: impl std::fmt::Display) -> Error {
    Error::llama(ExcClass::ChatTemplateError, "Init", None, err.to_string())
}

fn chat_value_error(err: impl std::fmt::Display) -> Error {
    Error::value(format!("the chat template cannot render this: {err}"))
}

#[cfg(test)]
mod tests {
    use super::template_variables;

    #[test]
    fn strings_go_as_their_json_text_and_enable_thinking_is_read() {
        let (thinking, kwargs) = template_variables(r#"{"greeting": "Be \"brief\".", "n": 2}"#).unwrap();
        assert!(thinking);
        let value: serde_json::Value = serde_json::from_str(&kwargs).unwrap();
        assert_eq!(value["greeting"], r#""Be \"brief\".""#);
        assert_eq!(value["n"], 2);
        assert!(!template_variables(r#"{"enable_thinking": false}"#).unwrap().0);
        assert!(template_variables(r#"{"enable_thinking": "no"}"#).is_err());
        assert!(template_variables("[1]").is_err());
    }
}
