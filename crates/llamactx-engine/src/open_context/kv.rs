//! KV-cache (llama.cpp "memory") operations on sequences.
//!
//! llama.cpp aborts on a sequence id outside `[0, n_seq_max)` and dereferences a null memory
//! for models without a KV cache (BERT-style encoders), so both are checked first. Positions
//! past `i32` raise `KvCacheConversionError`, as in the crate.

use llama_cpp_4::context::kv_cache::KvCacheConversionError;

use super::OpenContext;
use crate::errors::{Error, Result};

/// A position bound: `None` (or the crate's "to the end") stays `None`.
pub fn position(
    value: Option<i64>,
    too_large: fn(std::num::TryFromIntError) -> KvCacheConversionError,
) -> Result<Option<u32>> {
    match value {
        None => Ok(None),
        Some(p) if p < 0 => Err(Error::value(format!(
            "position {p} is negative; use None for an open end"
        ))),
        Some(p) => {
            // The crate converts to i32 itself; values past u32 never reach it.
            i32::try_from(p).map_err(|err| Error::from(too_large(err)))?;
            Ok(u32::try_from(p).ok())
        }
    }
}

impl OpenContext {
    /// `seq_id` as llama.cpp takes it, or an error naming the valid range.
    pub fn seq(&self, seq_id: i64) -> Result<i32> {
        if seq_id < 0 || seq_id >= i64::from(self.n_seq_max) {
            let too_large = i32::try_from(seq_id).err();
            if let Some(err) = too_large {
                return Err(KvCacheConversionError::SeqIdTooLarge(err).into());
            }
            return Err(Error::value(format!(
                "sequence id {seq_id} is out of range: the context holds sequences 0..{}",
                self.n_seq_max
            )));
        }
        Ok(i32::try_from(seq_id).map_err(KvCacheConversionError::SeqIdTooLarge)?)
    }

    /// `ValueError` for a context without a KV cache (an embedding-only model).
    pub fn require_memory(&self) -> Result<()> {
        if self.has_memory {
            Ok(())
        } else {
            Err(Error::value(
                "this model's context has no KV cache (an embedding-only model)",
            ))
        }
    }

    /// With one KV stream per sequence, llama.cpp copies between sequences by copying whole
    /// buffers and asserts on a partial range; refuse those copies first.
    pub fn check_copy(&self, src: i32, dest: i32, p0: i64, p1: i64) -> Result<()> {
        if self.kv_unified || src == dest {
            return Ok(());
        }
        let size = i64::from(self.with(|context| context.n_ctx_seq()));
        // llama.cpp computes `p + 1` in 32 bits: `i32::MAX` wraps negative and counts as partial.
        let partial = |p: i64| p > 0 && (p + 1 < size || p >= i64::from(i32::MAX));
        if partial(p0) || partial(p1) {
            return Err(Error::value(
                "with a KV stream per sequence (kv_unified=False) only whole sequences can be copied: \
                 use p0=None, p1=None, or create the context with kv_unified=True",
            ));
        }
        Ok(())
    }

    /// Whether positions can be shifted: llama.cpp says yes for a BF16 K cache, whose shift
    /// then aborts in the CPU's RoPE kernel (F16 and F32 only; quantized types are converted).
    pub fn can_shift(&self) -> bool {
        self.has_memory && self.k_cache_shifts && self.with(|context| context.memory_can_shift())
    }

    pub fn require_shift(&self) -> Result<()> {
        self.require_memory()?;
        if self.can_shift() {
            Ok(())
        } else {
            Err(Error::value(
                "this context's KV cache cannot shift positions (memory_can_shift() is False; a bf16 K cache \
                 cannot be shifted on the CPU)",
            ))
        }
    }

    /// Clears `seq_id` (every sequence for `None`) between positions `p0` and `p1`.
    /// `LlamaContext.copy_kv_cache_seq`.
    pub fn copy_seq(&mut self, src: i64, dest: i64, p0: Option<i64>, p1: Option<i64>) -> Result<()> {
        self.require_memory()?;
        let (src, dest) = (self.seq(src)?, self.seq(dest)?);
        let (start, end) = (p0.unwrap_or(-1), p1.unwrap_or(-1));
        let p0 = position(p0, KvCacheConversionError::P0TooLarge)?;
        let p1 = position(p1, KvCacheConversionError::P1TooLarge)?;
        self.check_copy(src, dest, start, end)?;
        Ok(self.with_mut(|context| context.copy_kv_cache_seq(src, dest, p0, p1))?)
    }

    pub fn clear_seq(&mut self, seq_id: Option<i64>, p0: Option<i64>, p1: Option<i64>) -> Result<bool> {
        self.require_memory()?;
        let seq_id = seq_id.map(|id| self.seq(id)).transpose()?;
        let p0 = position(p0, KvCacheConversionError::P0TooLarge)?;
        let p1 = position(p1, KvCacheConversionError::P1TooLarge)?;
        let seq_id = seq_id.map(i32::unsigned_abs);
        Ok(self.with_mut(|context| context.clear_kv_cache_seq(seq_id, p0, p1))?)
    }
}
