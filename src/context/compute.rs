//! `LlamaContext`'s methods that run the model and switch how it runs (`open_context/compute.rs`).

use pyo3::prelude::*;

use super::PyLlamaContext;
use crate::batch::python::PyLlamaBatch;
use crate::errors::python::to_py;
use crate::errors::Error;
use crate::threadpool::check_threads;

#[pymethods]
impl PyLlamaContext {
    /// Runs the model on `batch`, filling the KV cache and, for tokens added with
    /// `logits=True`, the output rows. Releases the GIL. Raises `ValueError` for a batch
    /// this context cannot take (too many tokens, unknown token or sequence ids) or before the
    /// first `encode` of an encoder-decoder model, and
    /// `DecodeError` when llama.cpp fails (e.g. `kind == "NoKvCacheSlot"` when the cache is full).
    fn decode(&self, py: Python<'_>, batch: &Bound<'_, PyLlamaBatch>) -> PyResult<()> {
        let batch = batch.get();
        self.run(py, |native| native.decode(&mut *batch.lock()?))
    }

    /// Runs the encoder on `batch` (T5-style models, or embedding models without a KV cache).
    /// Raises `ValueError` on a decoder-only model, where llama.cpp would crash, and for more
    /// tokens than `n_ubatch`; `EncodeError` when llama.cpp fails.
    fn encode(&self, py: Python<'_>, batch: &Bound<'_, PyLlamaBatch>) -> PyResult<()> {
        let batch = batch.get();
        self.run(py, |native| {
            if native.has_memory && !native.has_encoder {
                return Err(Error::value(
                    "encode needs a model with an encoder (T5-style) or without a KV cache (BERT-style); \
                     this is a decoder-only model: use decode",
                ));
            }
            native.compute(&mut *batch.lock()?, true, |context, batch| context.encode(batch))?;
            native.awaits_encoder = false;
            Ok(())
        })
    }

    /// Waits until llama.cpp has finished all queued computation.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |native| {
            native.with_mut(|context| context.synchronize());
            Ok(())
        })
    }

    /// Marks the next decodes as warm-up runs (they load every weight, as with an empty batch).
    fn set_warmup(&self, py: Python<'_>, warmup: bool) -> PyResult<()> {
        self.run(py, |native| {
            native.with_mut(|context| context.set_warmup(warmup));
            Ok(())
        })
    }

    /// Switches causal attention on or off. Without it, a decode may hold at most `n_ubatch`
    /// tokens.
    fn set_causal_attn(&self, py: Python<'_>, causal_attn: bool) -> PyResult<()> {
        self.run(py, |native| {
            native.with_mut(|context| context.set_causal_attn(causal_attn));
            native.causal_attn = causal_attn;
            Ok(())
        })
    }

    /// Switches embedding output on or off. With it, a decode may hold at most `n_ubatch`
    /// tokens. `ValueError` where llama.cpp cannot pool them (see `new_context`).
    fn set_embeddings(&self, py: Python<'_>, embeddings: bool) -> PyResult<()> {
        self.run(py, |native| native.enable_embeddings(embeddings))
    }

    /// Sets the threads for single-token and for batch decoding (each from 1 to the CPUs this
    /// process may use: ggml threads spin, so more run many times slower).
    fn set_n_threads(&self, py: Python<'_>, n_threads: i32, n_threads_batch: i32) -> PyResult<()> {
        check_threads("n_threads", n_threads).map_err(to_py)?;
        check_threads("n_threads_batch", n_threads_batch).map_err(to_py)?;
        self.run(py, |native| {
            native.with_mut(|context| context.set_n_threads(n_threads, n_threads_batch));
            Ok(())
        })
    }

    /// How the context pools embeddings, as a `LlamaPoolingType`.
    fn pooling_type<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pooling = self.read(py, |context| i32::from(context.pooling_type()))?;
        py.import("llamactx._enums")?
            .getattr("LlamaPoolingType")?
            .call1((pooling,))
    }

    /// Removes every token of every sequence from the KV cache (nothing to do for models
    /// without one).
    fn clear_kv_cache(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |native| {
            if native.has_memory {
                native.with_mut(|context| context.clear_kv_cache());
            }
            native.output_rows.clear();
            Ok(())
        })
    }
}
