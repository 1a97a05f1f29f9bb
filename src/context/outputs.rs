//! `LlamaContext`'s methods that read the last decode's outputs, always as new numpy arrays
//! (llama.cpp overwrites its buffers on the next decode; `open_context/outputs.rs`).

use llama_cpp_4::context::LlamaContext;
use numpy::{PyArray1, PyArray2};
use pyo3::prelude::*;

use super::PyLlamaContext;
use crate::arrays::{f32_matrix, f32_vector};
use crate::errors::python::to_py;
use crate::errors::Error;
use crate::open_context::outputs::embeddings_error;
use crate::token_data::PyLlamaTokenDataArray;

impl PyLlamaContext {
    /// Runs `read` on row `i` of the backend sampler's results, with the context locked.
    fn read_sampled<T: Send>(
        &self,
        py: Python<'_>,
        i: i32,
        read: impl for<'a> FnOnce(&LlamaContext<'a>, i32) -> T + Send,
    ) -> PyResult<T> {
        self.run(py, |native| {
            let row = native.sampled_row(i)?;
            Ok(native.with(|context| read(context, row)))
        })
    }
}

#[pymethods]
impl PyLlamaContext {
    /// Logits of the first output row, a new float32 array of shape `(n_vocab,)`.
    /// `IndexError` when no row has logits.
    fn get_logits<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let logits = self.run(py, |native| native.logits_of_row(native.first_output()))?;
        Ok(f32_vector(py, logits))
    }

    /// Logits of batch row `i` (negative `i` counts from the last output), a new float32
    /// array of shape `(n_vocab,)`. `IndexError` if row `i` has no logits.
    fn get_logits_ith<'py>(&self, py: Python<'py>, i: i32) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let logits = self.run(py, |native| native.logits_of_row(i))?;
        Ok(f32_vector(py, logits))
    }

    /// Every token of the first output row as a `LlamaTokenDataArray` (unsorted, p = 0).
    fn candidates(&self, py: Python<'_>) -> PyResult<PyLlamaTokenDataArray> {
        self.run(py, |native| {
            native.read_row(native.first_output(), |context, row| {
                PyLlamaTokenDataArray::from_logits(context.get_logits_ith(row))
            })
        })
    }

    /// Every token of batch row `i` as a `LlamaTokenDataArray`. `IndexError` if row `i` has
    /// no logits.
    fn candidates_ith(&self, py: Python<'_>, i: i32) -> PyResult<PyLlamaTokenDataArray> {
        self.run(py, |native| {
            native.read_row(i, |context, row| {
                PyLlamaTokenDataArray::from_logits(context.get_logits_ith(row))
            })
        })
    }

    /// The crate's `token_data_array`: the candidates of the first output row.
    fn token_data_array(&self, py: Python<'_>) -> PyResult<PyLlamaTokenDataArray> {
        self.candidates(py)
    }

    /// Token embeddings of every output row, a new float32 array `(n_outputs, n_embd)`.
    /// `EmbeddingsError` when embeddings are off, the context pools them, or no row has outputs.
    fn get_embeddings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let (values, rows) = self.run(py, |native| {
            if native.output_rows.is_empty() {
                return Err(embeddings_error(
                    "LogitsNotEnabled",
                    "no output row: decode a batch with outputs first",
                ));
            }
            let rows = i32::try_from(native.output_rows.len()).map_err(|_| Error::value("too many outputs"))?;
            let mut values = Vec::new();
            for k in 0..rows {
                values.extend(native.token_embeddings_row(k - rows)?);
            }
            Ok((values, native.output_rows.len()))
        })?;
        f32_matrix(py, values, rows)
    }

    /// Token embedding of batch row `i` (negative counts from the last output), a new float32
    /// array `(n_embd,)`. `EmbeddingsError` when embeddings are off, pooled, or the row has
    /// no output.
    fn embeddings_ith<'py>(&self, py: Python<'py>, i: i32) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let values = self.run(py, |native| native.token_embeddings_row(i))?;
        Ok(f32_vector(py, values))
    }

    /// Pooled embedding of sequence `seq` from the last batch (for RANK pooling: its scores),
    /// a new float32 array. `EmbeddingsError` when embeddings are off, the context does not
    /// pool, or `seq` was not in the last batch.
    fn embeddings_seq_ith<'py>(&self, py: Python<'py>, seq: i64) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let values = self.run(py, |native| {
            let seq = native.seq(seq)?;
            if !native.output_seqs.contains(&seq) {
                return Err(embeddings_error(
                    "NonePoolType",
                    format!("sequence {seq} was not in the last batch"),
                ));
            }
            native.with(|context| Ok(context.embeddings_seq_ith(seq)?.to_vec()))
        })?;
        Ok(f32_vector(py, values))
    }

    /// The token the backend sampler picked for batch row `i`. `IndexError` without a backend
    /// sampler, for a row without output, or when that row's sequence has no sampler.
    fn get_sampled_token_ith(&self, py: Python<'_>, i: i32) -> PyResult<i32> {
        let token = self.read_sampled(py, i, |context, row| context.get_sampled_token_ith(row).0)?;
        if token < 0 {
            return Err(to_py(Error::index(format!("row {i} has no backend-sampled token"))));
        }
        Ok(token)
    }

    /// The candidate token ids the backend sampler kept for row `i`, a new int32 array.
    fn get_sampled_candidates_ith<'py>(&self, py: Python<'py>, i: i32) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let ids = self.read_sampled(py, i, |context, row| {
            context
                .get_sampled_candidates_ith(row)
                .iter()
                .map(|token| token.0)
                .collect::<Vec<_>>()
        })?;
        Ok(PyArray1::from_vec(py, ids))
    }

    /// Number of logits the backend sampler kept for row `i`.
    fn get_sampled_logits_count_ith(&self, py: Python<'_>, i: i32) -> PyResult<u32> {
        self.read_sampled(py, i, |context, row| context.get_sampled_logits_count_ith(row))
    }

    /// The logits the backend sampler kept for row `i`, a new float32 array.
    fn get_sampled_logits_ith<'py>(&self, py: Python<'py>, i: i32) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let values = self.read_sampled(py, i, |context, row| context.get_sampled_logits_ith(row).to_vec())?;
        Ok(f32_vector(py, values))
    }

    /// Number of probabilities the backend sampler kept for row `i`.
    fn get_sampled_probs_count_ith(&self, py: Python<'_>, i: i32) -> PyResult<u32> {
        self.read_sampled(py, i, |context, row| context.get_sampled_probs_count_ith(row))
    }

    /// The probabilities the backend sampler kept for row `i`, a new float32 array.
    fn get_sampled_probs_ith<'py>(&self, py: Python<'py>, i: i32) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let values = self.read_sampled(py, i, |context, row| context.get_sampled_probs_ith(row).to_vec())?;
        Ok(f32_vector(py, values))
    }
}
