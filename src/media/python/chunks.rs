//! `MtmdInputChunks` and `MtmdInputChunk`: a tokenized prompt with media, for Python.

use std::sync::Arc;

use llama_cpp_4::mtmd::{MtmdInputChunk, MtmdInputChunkType};
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;

use crate::engine::MediaInput;
use crate::media::SharedChunks;

/// A prompt tokenized with its media by `MtmdContext.tokenize`; a sequence of `MtmdInputChunk`.
#[pyclass(frozen, sequence, module = "llamactx", name = "MtmdInputChunks")]
pub struct PyMtmdInputChunks {
    pub chunks: Arc<SharedChunks>,
    /// The `MtmdContext` that made them: only it can encode their media (a chunk holds the image
    /// preprocessed for its projector).
    pub made_by: u64,
}

impl PyMtmdInputChunks {
    /// These chunks as a prompt's media, to go before its text token `at`.
    pub fn input_at(&self, at: usize) -> MediaInput {
        MediaInput {
            at,
            chunks: Arc::clone(&self.chunks),
            made_by: self.made_by,
        }
    }

    pub fn get(&self, index: usize) -> Option<MtmdInputChunk<'_>> {
        self.chunks.get(index)
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }
}

#[pymethods]
impl PyMtmdInputChunks {
    fn __len__(&self) -> usize {
        self.len()
    }

    fn __getitem__(slf: &Bound<'_, Self>, index: isize) -> PyResult<PyMtmdInputChunk> {
        let len = slf.get().len();
        let position = if index < 0 {
            index.checked_add_unsigned(len)
        } else {
            Some(index)
        };
        match position.and_then(|at| usize::try_from(at).ok()).filter(|&at| at < len) {
            Some(index) => Ok(PyMtmdInputChunk {
                chunks: slf.clone().unbind(),
                index,
            }),
            None => Err(PyIndexError::new_err(format!(
                "chunk index {index} out of range for {len} chunks"
            ))),
        }
    }

    /// Tokens of all chunks (an image counts its embeddings).
    fn n_tokens(&self) -> usize {
        self.chunks.0.n_tokens()
    }

    /// Positions all chunks take in the KV cache (may differ from `n_tokens` for M-RoPE models).
    fn n_pos(&self) -> i32 {
        self.chunks.0.n_pos()
    }

    fn __repr__(&self) -> String {
        format!(
            "MtmdInputChunks({} chunks, {} tokens)",
            self.len(),
            self.chunks.0.n_tokens()
        )
    }
}

/// One chunk of an `MtmdInputChunks`: text tokens, or an image or audio clip's embeddings.
#[pyclass(frozen, module = "llamactx", name = "MtmdInputChunk")]
pub struct PyMtmdInputChunk {
    chunks: Py<PyMtmdInputChunks>,
    index: usize,
}

impl PyMtmdInputChunk {
    fn with<T>(&self, read: impl FnOnce(&MtmdInputChunk<'_>) -> T) -> T {
        let chunk = self.chunks.get().get(self.index);
        // The index was checked against the immutable list when this object was made.
        read(&chunk.expect("a chunk's index is checked at creation"))
    }
}

#[pymethods]
impl PyMtmdInputChunk {
    /// What the chunk holds, as an `MtmdInputChunkType`.
    fn chunk_type<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let kind = self.with(|chunk| match chunk.chunk_type() {
            MtmdInputChunkType::Text => 0,
            MtmdInputChunkType::Image => 1,
            MtmdInputChunkType::Audio => 2,
        });
        py.import("llamactx._enums")?
            .getattr("MtmdInputChunkType")?
            .call1((kind,))
    }

    /// Its tokens (an image's or audio clip's embeddings count as tokens).
    fn n_tokens(&self) -> usize {
        self.with(|chunk| chunk.n_tokens())
    }

    /// The KV positions it takes.
    fn n_pos(&self) -> i32 {
        self.with(|chunk| chunk.n_pos())
    }

    /// A text chunk's token ids; None for media.
    fn text_tokens(&self) -> Option<Vec<i32>> {
        self.with(|chunk| chunk.text_tokens().map(<[i32]>::to_vec))
    }

    /// A media chunk's id (its bitmap's, see `MtmdBitmap.id`); None for text.
    fn id(&self) -> Option<String> {
        self.with(|chunk| chunk.id().map(str::to_owned))
    }

    fn __repr__(&self) -> String {
        self.with(|chunk| format!("MtmdInputChunk({:?}, {} tokens)", chunk.chunk_type(), chunk.n_tokens()))
    }
}
