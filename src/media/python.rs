//! `MtmdContext`: the Python handle of a projector (`SharedMtmd`).

use std::sync::Arc;

use llama_cpp_4::mtmd::{MtmdContext, MtmdContextParams, MtmdInputChunks, MtmdInputPart, MtmdInputText};
use pyo3::prelude::*;

mod bitmap;
mod chunks;

pub use bitmap::PyMtmdBitmap;
pub use chunks::{PyMtmdInputChunk, PyMtmdInputChunks};

use super::{projector_file, SharedChunks, SharedMtmd};
use crate::backend::{backend, explained};
use crate::closing::closed_by_with;
use crate::context::PyLlamaContext;
use crate::errors::python::to_py;
use crate::errors::{Error, Result};
use crate::gil::detached;
use crate::model::python::PyLlamaModel;
use crate::paths::existing_file;
use crate::threadpool::{available_cpus, check_threads};

/// A multimodal projector (an mmproj GGUF) loaded for one text model: the vision or audio
/// encoder whose outputs the model reads as embeddings.
#[pyclass(frozen, module = "llamactx", name = "MtmdContext")]
pub struct PyMtmdContext {
    pub shared: Arc<SharedMtmd>,
    model: Py<PyLlamaModel>,
}

closed_by_with!(PyMtmdContext);

impl PyMtmdContext {
    fn chunks(
        &self,
        py: Python<'_>,
        fill: impl FnOnce(&MtmdContext, &mut MtmdInputChunks) -> Result<()> + Send,
    ) -> PyResult<PyMtmdInputChunks> {
        let chunks = detached(py, || {
            let mut chunks = MtmdInputChunks::new();
            let guard = self.shared.lock()?;
            let open = guard.as_ref().ok_or_else(|| Error::closed("MtmdContext"))?;
            fill(&open.native, &mut chunks)?;
            Ok(SharedChunks(chunks))
        })?;
        Ok(PyMtmdInputChunks {
            chunks: Arc::new(chunks),
            made_by: self.shared.id(),
        })
    }
}

/// One part of `tokenize_from_parts`: text or a bitmap.
#[derive(FromPyObject)]
enum Part {
    Text(String),
    Bitmap(Py<PyMtmdBitmap>),
}

#[pymethods]
impl PyMtmdContext {
    /// Loads the projector `mmproj_path` for `model`. `n_threads` encodes images (default: the
    /// CPUs this process may use); `image_min_tokens`/`image_max_tokens` bound the tokens of an
    /// image for projectors of dynamic resolution; `media_marker` replaces `default_marker()` in
    /// `tokenize`. `MtmdError` kind `InvalidProjector` for a file whose keys, hyperparameters or
    /// tensors do not fit its projector type (checked before llama.cpp reads it),
    /// `UnsupportedProjector` for a type whose files are not checked, `ContextCreateFailed` when
    /// llama.cpp refuses the file (not a projector, or one whose embeddings do not fit the model).
    #[new]
    #[pyo3(signature = (
        model, mmproj_path, *, use_gpu = true, n_threads = None, image_min_tokens = None,
        image_max_tokens = None, media_marker = None, warmup = false
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &Bound<'_, PyLlamaModel>,
        mmproj_path: &Bound<'_, PyAny>,
        use_gpu: bool,
        n_threads: Option<i32>,
        image_min_tokens: Option<i32>,
        image_max_tokens: Option<i32>,
        media_marker: Option<String>,
        warmup: bool,
    ) -> PyResult<Self> {
        let path = existing_file(mmproj_path)?;
        let text_model = model.get().native().map_err(to_py)?;
        let n_threads = match n_threads {
            Some(n) => check_threads("n_threads", n).map_err(to_py)?,
            None => available_cpus(),
        };
        for (name, value) in [
            ("image_min_tokens", image_min_tokens),
            ("image_max_tokens", image_max_tokens),
        ] {
            if value.is_some_and(|tokens| tokens <= 0) {
                return Err(to_py(Error::value(format!("{name} must be positive"))));
            }
        }
        let native = detached(py, || {
            let text_width = u64::try_from(text_model.n_embd_inp()).unwrap_or(0);
            projector_file::check_projector_file(&path, text_width)?;
            backend()?;
            let mut params = MtmdContextParams::default()
                .use_gpu(use_gpu)
                .n_threads(n_threads)
                .warmup(warmup)
                .print_timings(false);
            if let Some(tokens) = image_min_tokens {
                params = params.image_min_tokens(tokens);
            }
            if let Some(tokens) = image_max_tokens {
                params = params.image_max_tokens(tokens);
            }
            // Only when given: the crate's `None` is a null marker, which mtmd cannot read.
            if let Some(marker) = media_marker.as_deref() {
                params = params
                    .media_marker(Some(marker))
                    .map_err(|err| Error::value(err.to_string()))?;
            }
            explained(|| MtmdContext::init_from_file(&path, &text_model, params))
        })?;
        let shared = SharedMtmd::new(native, model.get().native().map_err(to_py)?);
        Ok(Self {
            shared: Arc::new(shared),
            model: model.clone().unbind(),
        })
    }

    /// The marker `tokenize` replaces with a bitmap unless `media_marker` was given: `<__media__>`.
    #[staticmethod]
    fn default_marker() -> &'static str {
        MtmdContext::default_marker()
    }

    /// The `LlamaModel` this projector was loaded for.
    #[getter]
    fn model(&self, py: Python<'_>) -> Py<PyLlamaModel> {
        self.model.clone_ref(py)
    }

    /// The marker `tokenize` replaces with a bitmap.
    fn marker(&self) -> PyResult<String> {
        self.shared.read(|native| native.marker().to_owned()).map_err(to_py)
    }

    /// Whether the projector reads images.
    fn supports_vision(&self) -> PyResult<bool> {
        self.shared.read(MtmdContext::supports_vision).map_err(to_py)
    }

    /// Whether the projector reads audio.
    fn supports_audio(&self) -> PyResult<bool> {
        self.shared.read(MtmdContext::supports_audio).map_err(to_py)
    }

    /// The sample rate audio must have (Hz); -1 without audio support.
    fn audio_sample_rate(&self) -> PyResult<i32> {
        self.shared.read(MtmdContext::audio_sample_rate).map_err(to_py)
    }

    /// Whether the model places media with several positions per embedding (M-RoPE): the
    /// chunks' `n_pos` then differs from `n_tokens`.
    fn decode_use_mrope(&self) -> PyResult<bool> {
        self.shared.read(MtmdContext::decode_use_mrope).map_err(to_py)
    }

    /// Media chunks encoded by this projector so far. The embeddings of the last 16 media
    /// (up to 256 MiB) are kept by id and chunk (a long clip or a tiled image is several chunks of one
    /// id): evaluating the same image again does not encode it.
    fn n_encodes(&self) -> PyResult<u64> {
        Ok(self
            .shared
            .lock()
            .map_err(to_py)?
            .as_ref()
            .map_or(0, |open| open.encodes))
    }

    /// Tokenizes `text`, in which each `marker()` stands for the next of `bitmaps`
    /// (special tokens parsed when `parse_special`). `MtmdError` kind `TokenizeError` when the
    /// markers and bitmaps do not match or the projector cannot read a bitmap's kind of media.
    #[pyo3(signature = (text, bitmaps = Vec::new(), *, add_special = true, parse_special = true))]
    fn tokenize(
        &self,
        py: Python<'_>,
        text: &str,
        bitmaps: Vec<Py<PyMtmdBitmap>>,
        add_special: bool,
        parse_special: bool,
    ) -> PyResult<PyMtmdInputChunks> {
        self.chunks(py, |native, chunks| {
            let guards: Vec<_> = bitmaps.iter().map(|bitmap| bitmap.get().read()).collect();
            let refs: Vec<_> = guards.iter().map(|guard| &**guard).collect();
            let input = MtmdInputText::new(text, add_special, parse_special);
            explained(|| native.tokenize(&input, &refs, chunks))
        })
    }

    /// Tokenizes `parts` (strings and `MtmdBitmap`s) in order, without markers: a marker in
    /// the text is text. Special tokens are parsed in the strings when `parse_special`.
    #[pyo3(signature = (parts, *, add_special = true, parse_special = false))]
    fn tokenize_from_parts(
        &self,
        py: Python<'_>,
        parts: Vec<Part>,
        add_special: bool,
        parse_special: bool,
    ) -> PyResult<PyMtmdInputChunks> {
        self.chunks(py, |native, chunks| {
            let guards: Vec<_> = parts
                .iter()
                .filter_map(|part| match part {
                    Part::Bitmap(bitmap) => Some(bitmap.get().read()),
                    Part::Text(_) => None,
                })
                .collect();
            let texts: Vec<_> = parts
                .iter()
                .filter_map(|part| match part {
                    Part::Text(text) => Some(MtmdInputText::new(text, add_special, parse_special)),
                    Part::Bitmap(_) => None,
                })
                .collect();
            let (mut next_text, mut next_bitmap) = (texts.iter(), guards.iter());
            let inputs: Vec<MtmdInputPart<'_>> = parts
                .iter()
                .filter_map(|part| match part {
                    Part::Text(_) => next_text.next().map(MtmdInputPart::Text),
                    Part::Bitmap(_) => next_bitmap.next().map(|guard| MtmdInputPart::Bitmap(guard)),
                })
                .collect();
            explained(|| native.tokenize_from_parts(&inputs, add_special, chunks))
        })
    }

    /// Evaluates `chunks` into sequence `seq_id` of `ctx` from position `n_past`, which must be
    /// where the sequence ends: text in decodes of `n_batch` tokens, each image or audio clip
    /// encoded by the projector, then decoded as embeddings. With `logits_last`, the last
    /// token has logits (output row -1) when the prompt ends with text. Returns the position
    /// after the chunks. All or nothing, like `decode`: on any failure the sequence is cut back
    /// to `n_past` and the error raised (`ValueError` for chunks of another projector or a
    /// context of another model, `MtmdError` when encoding fails, `DecodeError`...).
    #[pyo3(signature = (ctx, chunks, n_past, seq_id = 0, *, logits_last = true))]
    fn eval_chunks(
        &self,
        py: Python<'_>,
        ctx: &Bound<'_, PyLlamaContext>,
        chunks: &Bound<'_, PyMtmdInputChunks>,
        n_past: i32,
        seq_id: i32,
        logits_last: bool,
    ) -> PyResult<i32> {
        let chunks = chunks.get();
        self.shared.check_made(chunks.made_by).map_err(to_py)?;
        ctx.get().run(py, |context| {
            if !self.shared.is_for(context.model()) {
                return Err(Error::value(
                    "the context runs another model than the one this MtmdContext was loaded for",
                ));
            }
            let mut guard = self.shared.lock()?;
            let open = guard.as_mut().ok_or_else(|| Error::closed("MtmdContext"))?;
            context.eval_chunks(open, &chunks.chunks, n_past, seq_id, logits_last)
        })
    }

    /// Frees the projector now; later calls raise `ValueError`.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        detached(py, || self.shared.close())
    }
}
