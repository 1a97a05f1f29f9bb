//! Reading what the last decode produced: logits, candidates, embeddings and backend-sampled
//! results.

use llama_cpp_4::context::params::LlamaPoolingType;
use llama_cpp_4::context::LlamaContext;

use super::OpenContext;
use crate::errors::{Error, ExcClass, Result};

pub fn embeddings_error(kind: &str, message: impl Into<String>) -> Error {
    Error::llama(ExcClass::EmbeddingsError, kind, None, message)
}

impl OpenContext {
    /// The batch index of output row `i` (negative counts from the last output), or
    /// `IndexError` when that row has no outputs.
    pub fn output_row(&self, i: i32) -> Result<i32> {
        if self.output_rows.is_empty() {
            return Err(Error::index(
                "no output row has logits: decode a batch with logits=True first (a state restore leaves none)",
            ));
        }
        let found = if i < 0 {
            i64::try_from(self.output_rows.len())
                .ok()
                .and_then(|n| usize::try_from(n + i64::from(i)).ok())
                .map(|k| self.output_rows[k])
        } else {
            self.output_rows.contains(&i).then_some(i)
        };
        found.ok_or_else(|| {
            Error::index(format!(
                "row {i} has no logits; rows with logits: {:?}",
                self.output_rows
            ))
        })
    }

    /// Like `output_row`, for reading a full row of `n_vocab` logits: with a backend sampler
    /// set, llama.cpp's logits buffer may be shorter than that.
    pub fn full_logits_row(&self, i: i32) -> Result<i32> {
        if !self.backend_samplers.is_empty() {
            return Err(Error::index(
                "a backend sampler is set (set_sampler): full logits are not kept; use the get_sampled_* methods",
            ));
        }
        let row = self.output_row(i)?;
        // SAFETY: `as_ptr` is the live context this value owns; `llama_get_logits` returns its
        // logits buffer, null when the context computes none.
        if self.with(|context| unsafe { llama_cpp_sys_4::llama_get_logits(context.as_ptr()) }.is_null()) {
            return Err(Error::index(
                "this context computes no logits (pooled embeddings, or a model without an output head): \
                 use the embeddings getters, or a context with embeddings=False",
            ));
        }
        Ok(row)
    }

    /// Reads output row `i` (checked) of the context.
    pub fn read_row<T: Send>(&self, i: i32, read: impl for<'a> FnOnce(&LlamaContext<'a>, i32) -> T) -> Result<T> {
        let row = self.full_logits_row(i)?;
        Ok(self.with(|context| read(context, row)))
    }

    pub fn logits_of_row(&self, i: i32) -> Result<Vec<f32>> {
        self.read_row(i, |context, row| context.get_logits_ith(row).to_vec())
    }

    pub fn first_output(&self) -> i32 {
        self.output_rows.first().copied().unwrap_or(0)
    }

    /// Token embeddings exist only without pooling; pooled contexts write per-sequence ones.
    pub fn token_embeddings_row(&self, i: i32) -> Result<Vec<f32>> {
        if self.with(|context| context.pooling_type()) != LlamaPoolingType::None {
            return Err(embeddings_error(
                "LogitsNotEnabled",
                "this context pools embeddings per sequence: use embeddings_seq_ith",
            ));
        }
        let row = self
            .output_row(i)
            .map_err(|_| embeddings_error("LogitsNotEnabled", format!("row {i} has no output")))?;
        self.with(|context| Ok(context.embeddings_ith(row)?.to_vec()))
    }

    pub fn sampled_row(&self, i: i32) -> Result<i32> {
        if self.backend_samplers.is_empty() {
            return Err(Error::index("no backend sampler is set: use set_sampler first"));
        }
        self.output_row(i)
    }
}
