//! Decoding batches and clearing what they left in the KV cache.

use pyo3::prelude::*;

use super::{Native, PyLlamaContext};
use crate::batch::PyLlamaBatch;
use crate::errors::Result;

impl Native {
    /// The most tokens one call may submit: llama.cpp asserts when a decode exceeds `n_batch`,
    /// or, for embeddings (non-causal or pooled graphs), one micro-batch.
    fn batch_limit(&self) -> (u32, &'static str) {
        if self.embeddings {
            (self.n_ubatch, "n_ubatch")
        } else {
            (self.n_batch, "n_batch")
        }
    }

    fn decode(&mut self, batch: &PyLlamaBatch) -> Result<()> {
        let mut state = batch.lock()?;
        let (limit, limit_name) = self.batch_limit();
        state.check_for(self.n_vocab, self.n_seq_max, limit, limit_name)?;
        let decoded = self.with_mut(|context| context.decode(&mut state.batch));
        self.logit_rows = match decoded {
            Ok(()) => state.logit_rows.clone(),
            // A failed decode leaves llama.cpp's outputs in no state worth reading.
            Err(_) => Vec::new(),
        };
        Ok(decoded?)
    }
}

#[pymethods]
impl PyLlamaContext {
    /// Runs the model on `batch`, filling the KV cache and, for tokens added with
    /// `logits=True`, the output rows. Releases the GIL. Raises `ValueError` for a batch
    /// this context cannot take (too many tokens, unknown token or sequence ids) and
    /// `DecodeError` when llama.cpp fails (e.g. `kind == "NoKvCacheSlot"` when the cache is full).
    fn decode(&self, py: Python<'_>, batch: &Bound<'_, PyLlamaBatch>) -> PyResult<()> {
        let batch = batch.get();
        self.run(py, |native| native.decode(batch))
    }

    /// Removes every token of every sequence from the KV cache (nothing to do for models
    /// without one).
    fn clear_kv_cache(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |native| {
            if native.has_memory {
                native.with_mut(|context| context.clear_kv_cache());
            }
            native.logit_rows.clear();
            Ok(())
        })
    }
}
