//! `LlamaModel`: a loaded GGUF model, its tokenizer, metadata and chat template, for Python.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use llama_cpp_4::model::params::{LlamaLoadMode, LlamaModelParams};
use llama_cpp_4::model::{AddBos, LlamaChatMessage, LlamaModel};
use llama_cpp_4::{ApplyChatTemplateError, StringFromModelError, TokenToStringError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyType};

use super::{check_special_tokens, piece, special, VocabularyGap};
use crate::backend::{backend, explained};
use crate::closing::closed_by_with;
use crate::context::PyLlamaContext;
use crate::errors::python::to_py;
use crate::errors::{Error, ExcClass, Result};
use crate::gil::detached;
use crate::lora::python::PyLlamaLoraAdapter;
use crate::lora::LoraAdapter;
use crate::metadata::{self, ModelFileFacts};
use crate::paths::existing_file;
use crate::rpc::{self, ModelLinks};
use crate::tokens::python::extract_token_ids;
use crate::tokens::{check_vocab, to_ids, to_llama_tokens};

/// A model loaded from a GGUF file. Shared by every context made from it, and kept alive by
/// them: closing or deleting the Python object while contexts exist is safe.
#[pyclass(frozen, module = "llamactx", name = "LlamaModel")]
pub struct PyLlamaModel {
    model: RwLock<Option<Arc<LlamaModel>>>,
    path: PathBuf,
    /// Loaded without weights: llama.cpp makes a context for it that aborts on its first decode.
    vocab_only: bool,
    /// What its vocabulary lacks for turning text into tokens and back.
    gap: Option<VocabularyGap>,
    /// What its file's header says that contexts must respect.
    facts: ModelFileFacts,
}

closed_by_with!(PyLlamaModel);

impl PyLlamaModel {
    /// The native model, or `ValueError` once closed.
    pub fn native(&self) -> Result<Arc<LlamaModel>> {
        let guard = self.model.read().map_err(|_| Error::Poisoned("LlamaModel"))?;
        guard.clone().ok_or_else(|| Error::closed("LlamaModel"))
    }

    /// Whether the model reads learned position embeddings: a context may hold at most
    /// `n_ctx_train` positions.
    pub fn learned_positions(&self) -> bool {
        self.facts.learned_positions
    }

    /// The native model, for turning text into tokens: `ValueError` for a vocabulary
    /// llama.cpp's tokenizer would abort or throw on.
    pub fn tokenizer(&self) -> Result<Arc<LlamaModel>> {
        match self.gap {
            Some(gap) => Err(gap.error()),
            None => self.native(),
        }
    }

    /// The native model, for turning tokens into text: `ValueError` for a model without
    /// token texts.
    pub fn vocabulary(&self) -> Result<Arc<LlamaModel>> {
        match self.gap {
            Some(gap @ VocabularyGap::NoTokenizer) => Err(gap.error()),
            _ => self.native(),
        }
    }

    fn with_model<T>(&self, read: impl FnOnce(&LlamaModel) -> Result<T>) -> PyResult<T> {
        read(&*self.native().map_err(to_py)?).map_err(to_py)
    }
}

/// The start of a template, for an error message.
fn abbreviated(template: &str) -> String {
    const SHOWN: usize = 60;
    let mut shown: String = template.chars().take(SHOWN).collect();
    if template.chars().nth(SHOWN).is_some() {
        shown.push('…');
    }
    shown
}

#[pymethods]
impl PyLlamaModel {
    /// Loads a GGUF model. Releases the GIL while loading.
    ///
    /// `n_gpu_layers` layers are offloaded to a GPU when llama.cpp was built with one, or to the
    /// `rpc_servers` (`"host:port"` of `llamactx rpc-server`s, filled in order); by default none
    /// locally and every layer with RPC servers. `rpc_timeout` (seconds) bounds every connection
    /// to them and every answer awaited from them. `vocab_only` loads only the tokenizer.
    /// `use_mmap`/`use_mlock` choose how the weights are read. llama-cpp-4 0.11 cannot pass a
    /// progress callback to llama.cpp, so there is none. Raises `FileNotFoundError` for a
    /// missing file, `ValueError` for a path that is not UTF-8 or holds a NUL byte,
    /// `RpcError` for an RPC server that is unreachable, busy, of another protocol version or
    /// failing while the weights go to it, and `LlamaModelLoadError` when llama.cpp refuses
    /// the file.
    #[classmethod]
    #[pyo3(signature = (
        path, *, n_gpu_layers=None, main_gpu=None, vocab_only=false, use_mmap=true, use_mlock=false,
        rpc_servers=None, rpc_timeout=60.0
    ))]
    fn load_from_file(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        n_gpu_layers: Option<u32>,
        main_gpu: Option<i32>,
        vocab_only: bool,
        use_mmap: bool,
        use_mlock: bool,
        rpc_servers: Option<Vec<String>>,
        rpc_timeout: f64,
    ) -> PyResult<Self> {
        let path = existing_file(path)?;
        let timeout = rpc::timeout(rpc_timeout).map_err(to_py)?;
        let facts = detached(py, || metadata::check_model_file(&path))?;
        let load_mode = match (use_mmap, use_mlock) {
            (true, false) => LlamaLoadMode::Mmap,
            (true, true) => LlamaLoadMode::MmapMlock,
            (false, false) => LlamaLoadMode::None,
            (false, true) => LlamaLoadMode::Mlock,
        };
        let (model, gap) = detached(py, || {
            let links = rpc_servers
                .map(|endpoints| ModelLinks::connect(&endpoints, timeout).map(Arc::new))
                .transpose()?;
            let all_layers = if links.is_some() { u32::MAX } else { 0 };
            // Built here: the params hold raw pointers, so they cannot cross threads.
            let mut params = LlamaModelParams::default()
                .with_n_gpu_layers(n_gpu_layers.unwrap_or(all_layers))
                .with_vocab_only(vocab_only)
                .with_load_mode(load_mode);
            if let Some(main_gpu) = main_gpu {
                params = params.with_main_gpu(main_gpu);
            }
            let backend = backend()?;
            let model = Arc::new(match &links {
                Some(links) => links.load(&path, &params)?,
                None => explained(|| LlamaModel::load_from_file(backend, &path, &params))?,
            });
            if let Some(links) = links {
                rpc::attach(&model, links);
            }
            let gap = VocabularyGap::find(&model);
            Ok((model, gap))
        })?;
        Ok(Self {
            gap,
            model: RwLock::new(Some(model)),
            path,
            vocab_only,
            facts,
        })
    }

    /// Where the model's weights went: a dict per part, `{"name", "kind", "endpoint",
    /// "weight_bytes"}`. `kind` is "rpc" for an RPC server (`endpoint` is its host:port, `name`
    /// its devices, `weight_bytes` what the loader allocated there), then "cpu" for this machine
    /// (`weight_bytes` is None for a model split across servers: llama.cpp does not report it).
    /// A model without RPC servers has one part, the CPU, with all its weights.
    fn devices<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let model = self.native().map_err(to_py)?;
        rpc::placements(rpc::links_of(&model).as_deref(), model.model_size())
            .into_iter()
            .map(|part| {
                let dict = PyDict::new(py);
                dict.set_item("name", part.name)?;
                dict.set_item("kind", part.kind)?;
                dict.set_item("endpoint", part.endpoint)?;
                dict.set_item("weight_bytes", part.weight_bytes)?;
                Ok(dict)
            })
            .collect()
    }

    /// Creates a context (KV cache, compute buffers) on this model. Releases the GIL.
    ///
    /// Keywords are the crate's `LlamaContextParams::with_*` builders without `with_`; `None`
    /// keeps llama.cpp's default. `pooling_type`, `flash_attn_type` and `attention_type` take
    /// the matching IntEnum or its int value; `cache_type_k`/`cache_type_v` take a ggml type
    /// name such as `"f16"` or `"q8_0"`. `TypeError` for an unknown keyword (it lists them);
    /// `ValueError` for values llama.cpp would abort on, and for a model loaded with
    /// `vocab_only=True` (it has no weights to compute with).
    #[pyo3(signature = (**options))]
    fn new_context(slf: &Bound<'_, Self>, options: Option<&Bound<'_, PyDict>>) -> PyResult<PyLlamaContext> {
        let options = crate::context::params::from_kwargs(options)?;
        if slf.get().vocab_only {
            return Err(to_py(Error::value(
                "this model was loaded with vocab_only=True: it has no weights to make a context with",
            )));
        }
        PyLlamaContext::create(slf, options)
    }

    /// Tokenizes `text`. `add_bos` adds the BOS (and EOS) tokens where the model's tokenizer
    /// is configured to add them (llama.cpp's `add_special`; see `add_bos_token()`);
    /// `special` parses special tokens such as `<|im_start|>` written in the text (the
    /// crate's default). Releases the GIL.
    #[pyo3(signature = (text, add_bos=true, *, special=true))]
    fn str_to_token(&self, py: Python<'_>, text: &str, add_bos: bool, special: bool) -> PyResult<Vec<i32>> {
        let add_bos = if add_bos { AddBos::Always } else { AddBos::Never };
        let model = self.tokenizer().map_err(to_py)?;
        detached(py, || {
            if add_bos == AddBos::Always {
                check_special_tokens(&model)?;
            }
            Ok(to_ids(&model.str_to_token_with_special(
                text,
                add_bos,
                self::special(special),
            )?))
        })
    }

    /// The text of one token. `special=True` renders special tokens (e.g. `<|im_end|>`),
    /// `False` renders them as empty text. Raises `TokenToStringError` for a token whose
    /// bytes are not valid UTF-8 on their own; use `token_to_bytes` for those.
    #[pyo3(signature = (token, special=true))]
    fn token_to_str(&self, token: i32, special: bool) -> PyResult<String> {
        let piece = piece(&*self.vocabulary().map_err(to_py)?, token, special).map_err(to_py)?;
        String::from_utf8(piece).map_err(|err| to_py(Error::from(TokenToStringError::FromUtf8Error(err))))
    }

    /// The raw bytes of one token (a multi-byte character may be split across tokens).
    #[pyo3(signature = (token, special=true))]
    fn token_to_bytes<'py>(&self, py: Python<'py>, token: i32, special: bool) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = piece(&*self.vocabulary().map_err(to_py)?, token, special).map_err(to_py)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Turns tokens back into text. `remove_special` drops BOS/EOS where the model adds them;
    /// `unparse_special` renders special tokens as text. Releases the GIL.
    #[pyo3(signature = (tokens, remove_special=false, unparse_special=false))]
    fn detokenize(&self, tokens: &Bound<'_, PyAny>, remove_special: bool, unparse_special: bool) -> PyResult<String> {
        let ids = extract_token_ids(tokens)?;
        let model = self.vocabulary().map_err(to_py)?;
        detached(tokens.py(), || {
            check_vocab(&ids, model.n_vocab())?;
            Ok(model.detokenize(&to_llama_tokens(&ids), remove_special, unparse_special)?)
        })
    }

    /// Number of tokens in the vocabulary.
    fn n_vocab(&self) -> PyResult<i32> {
        self.with_model(|model| Ok(model.n_vocab()))
    }

    /// Width of the model's embeddings.
    fn n_embd(&self) -> PyResult<i32> {
        self.with_model(|model| Ok(model.n_embd()))
    }

    /// Number of layers.
    fn n_layer(&self) -> PyResult<i32> {
        self.with_model(|model| Ok(model.n_layer()))
    }

    /// Number of attention heads.
    fn n_head(&self) -> PyResult<i32> {
        self.with_model(|model| Ok(model.n_head()))
    }

    /// Context length the model was trained with.
    fn n_ctx_train(&self) -> PyResult<u32> {
        self.with_model(|model| Ok(model.n_ctx_train()))
    }

    /// Number of parameters.
    fn n_params(&self) -> PyResult<u64> {
        self.with_model(|model| Ok(model.n_params()))
    }

    /// Size of the weights in bytes.
    fn model_size(&self) -> PyResult<u64> {
        self.with_model(|model| Ok(model.model_size()))
    }

    /// Beginning-of-sequence token.
    fn token_bos(&self) -> PyResult<i32> {
        self.with_model(|model| Ok(model.token_bos().0))
    }

    /// End-of-sequence token.
    fn token_eos(&self) -> PyResult<i32> {
        self.with_model(|model| Ok(model.token_eos().0))
    }

    /// End-of-turn token (-1 when the model has none).
    fn token_eot(&self) -> PyResult<i32> {
        self.with_model(|model| Ok(model.token_eot().0))
    }

    /// Newline token.
    fn token_nl(&self) -> PyResult<i32> {
        self.with_model(|model| Ok(model.token_nl().0))
    }

    /// Whether `token` ends generation (EOS, EOT, ...).
    fn is_eog_token(&self, token: i32) -> PyResult<bool> {
        self.with_model(|model| Ok(model.is_eog_token(super::token(model, token)?)))
    }

    /// Whether the tokenizer adds a BOS token.
    fn add_bos_token(&self) -> PyResult<bool> {
        self.with_model(|model| Ok(model.add_bos_token()))
    }

    /// Whether the model has an encoder (T5-style), i.e. supports `LlamaContext.encode`.
    fn has_encoder(&self) -> PyResult<bool> {
        self.with_model(|model| Ok(model.has_encoder()))
    }

    /// Whether the model has a decoder.
    fn has_decoder(&self) -> PyResult<bool> {
        self.with_model(|model| Ok(model.has_decoder()))
    }

    /// Whether the model is recurrent (Mamba, RWKV): its state per sequence cannot be cut back to
    /// an earlier position.
    fn is_recurrent(&self) -> PyResult<bool> {
        self.with_model(|model| Ok(model.is_recurrent()))
    }

    /// Whether the model mixes recurrent and attention layers (Jamba, Granite 4): its state per
    /// sequence cannot be cut back to an earlier position either.
    fn is_hybrid(&self) -> PyResult<bool> {
        self.with_model(|model| Ok(model.is_hybrid()))
    }

    /// The value of one metadata key, as text; `StringFromModelError` when it is missing.
    fn meta_val_str(&self, key: &str) -> PyResult<String> {
        self.with_model(|model| metadata::value(model, &self.path, key))
    }

    /// Number of metadata entries (arrays excluded, as llama.cpp does).
    fn meta_count(&self) -> PyResult<i32> {
        self.with_model(|model| Ok(model.meta_count()))
    }

    /// All metadata as a `dict` of text values.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let entries = self.with_model(|model| metadata::all(model, &self.path))?;
        let dict = PyDict::new(py);
        for (key, value) in entries {
            dict.set_item(key, value)?;
        }
        Ok(dict)
    }

    /// A short description of the model (architecture, size, quantization).
    fn desc(&self) -> PyResult<String> {
        self.with_model(|model| Ok(model.desc(256)?))
    }

    /// The model's chat template (a Jinja string), or its template named `name` (GGUF's
    /// `tokenizer.chat_template.NAME`, e.g. a reranker's "rerank"); `ChatTemplateError` when it
    /// has none.
    #[pyo3(signature = (name=None))]
    fn get_chat_template(&self, name: Option<&str>) -> PyResult<String> {
        self.with_model(|model| metadata::chat_template(model, name))
    }

    /// Number of outputs of the model's classification head (a reranker's scores per sequence
    /// under `LlamaPoolingType.RANK`); 1 for a model without one.
    fn n_cls_out(&self) -> PyResult<u32> {
        self.with_model(|model| Ok(model.n_cls_out()))
    }

    /// The label of output `index` of the classification head; `IndexError` when the model
    /// names none there.
    fn cls_label(&self, index: u32) -> PyResult<String> {
        self.with_model(|model| match model.cls_label(index) {
            Ok(label) => Ok(label.to_owned()),
            Err(StringFromModelError::ReturnedError(_)) => {
                Err(Error::index(format!("the model has no classifier label {index}")))
            }
            Err(err) => Err(err.into()),
        })
    }

    /// Formats `messages` (a sequence of `(role, content)` pairs or of dicts with `role` and
    /// `content`) with the model's template, or with `tmpl` when given; `add_ass` ends the
    /// prompt with the assistant's turn opener. llama.cpp applies the template with its
    /// built-in formats, not a full Jinja engine.
    #[pyo3(signature = (messages, tmpl=None, add_ass=true))]
    fn apply_chat_template(
        &self,
        messages: &Bound<'_, PyAny>,
        tmpl: Option<String>,
        add_ass: bool,
    ) -> PyResult<String> {
        let mut chat = Vec::new();
        for message in messages.try_iter()? {
            let message = message?;
            let (role, content): (String, String) = if let Ok(dict) = message.cast::<PyDict>() {
                let field = |name: &str| -> PyResult<String> {
                    dict.get_item(name)?
                        .ok_or_else(|| to_py(Error::value(format!("chat message lacks '{name}'"))))?
                        .extract()
                };
                (field("role")?, field("content")?)
            } else {
                message.extract()?
            };
            chat.push(
                LlamaChatMessage::new(role, content)
                    .map_err(Error::from)
                    .map_err(to_py)?,
            );
        }
        self.with_model(|model| {
            let template = match tmpl {
                Some(template) => template,
                None => metadata::chat_template(model, None)?,
            };
            model
                .apply_chat_template(Some(&template), &chat, add_ass)
                .map_err(|err| match err {
                    // llama.cpp's "unsupported template" (-1), which the crate words as a size.
                    ApplyChatTemplateError::BuffSizeError => Error::llama(
                        ExcClass::ApplyChatTemplateError,
                        "UnknownTemplate",
                        None,
                        format!(
                            "llama.cpp has no built-in chat format for the template {:?}: name one of its formats \
                             (e.g. \"chatml\") or give a template it recognises",
                            abbreviated(&template)
                        ),
                    ),
                    other => other.into(),
                })
        })
    }

    /// Loads a LoRA adapter (GGUF) made for this model. Releases the GIL.
    /// `LlamaLoraAdapterInitError` when llama.cpp refuses the file, and for tensors of a type no
    /// CPU kernel multiplies (`kind == "UnsupportedTensorType"`).
    fn lora_adapter_init(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<PyLlamaLoraAdapter> {
        let path = existing_file(path)?;
        let model = self.native().map_err(to_py)?;
        detached(py, move || {
            metadata::check_adapter_file(&path)?;
            let adapter = explained(|| model.lora_adapter_init(&path))?;
            Ok(PyLlamaLoraAdapter(Arc::new(LoraAdapter::new(adapter, model, path))))
        })
    }

    /// Path of the GGUF file.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Drops this object's hold on the native model. Contexts made from it keep it alive until
    /// they close; every later call on this object raises `ValueError`.
    fn close(&self, _py: Python<'_>) -> PyResult<()> {
        let mut guard = self.model.write().map_err(|_| to_py(Error::Poisoned("LlamaModel")))?;
        *guard = None;
        Ok(())
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.model.read().map_or(true, |guard| guard.is_none())
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { " (closed)" } else { "" };
        format!("<LlamaModel {}{state}>", self.path.display())
    }
}
