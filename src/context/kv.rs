//! KV-cache (llama.cpp "memory") operations on sequences.
//!
//! llama.cpp aborts on a sequence id outside `[0, n_seq_max)` and dereferences a null memory
//! for models without a KV cache (BERT-style encoders), so both are checked first. Positions
//! past `i32` raise `KvCacheConversionError`, as in the crate.

use std::num::NonZeroU8;

use llama_cpp_4::context::kv_cache::KvCacheConversionError;
use pyo3::prelude::*;

use super::{OpenContext, PyLlamaContext};
use crate::batch::MAX_POSITION;
use crate::errors::{Error, Result};

/// A position bound: `None` (or the crate's "to the end") stays `None`.
fn position(
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
    pub(super) fn seq(&self, seq_id: i64) -> Result<i32> {
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
    fn check_copy(&self, src: i32, dest: i32, p0: i64, p1: i64) -> Result<()> {
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
    fn can_shift(&self) -> bool {
        self.has_memory && self.k_cache_shifts && self.with(|context| context.memory_can_shift())
    }

    fn require_shift(&self) -> Result<()> {
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

#[pymethods]
impl PyLlamaContext {
    /// Copies the first `size` positions of sequence `src` to sequence `dest`.
    fn copy_cache(&self, py: Python<'_>, src: i64, dest: i64, size: i64) -> PyResult<()> {
        let size = i32::try_from(size.max(-1)).map_err(|_| Error::value(format!("size {size} is too large")))?;
        self.run(py, |native| {
            native.require_memory()?;
            let (src, dest) = (native.seq(src)?, native.seq(dest)?);
            native.check_copy(src, dest, 0, i64::from(size))?;
            native.with_mut(|context| context.copy_cache(src, dest, size));
            Ok(())
        })
    }

    /// Copies the cells of sequence `src` between positions `p0` and `p1` (`None`: open end)
    /// to sequence `dest`, which then continues exactly like `src`.
    #[pyo3(signature = (src, dest, p0=None, p1=None))]
    fn copy_kv_cache_seq(&self, py: Python<'_>, src: i64, dest: i64, p0: Option<i64>, p1: Option<i64>) -> PyResult<()> {
        self.run(py, |native| native.copy_seq(src, dest, p0, p1))
    }

    /// Removes the cells of sequence `src` (all sequences for `None`) between positions `p0`
    /// and `p1`. Returns False when llama.cpp cannot remove part of a sequence (recurrent
    /// models).
    #[pyo3(signature = (src=None, p0=None, p1=None))]
    fn clear_kv_cache_seq(&self, py: Python<'_>, src: Option<i64>, p0: Option<i64>, p1: Option<i64>) -> PyResult<bool> {
        self.run(py, |native| native.clear_seq(src, p0, p1))
    }

    /// Removes every sequence except `seq_id`. (With a KV stream per sequence, llama.cpp's
    /// own call only reaches `seq_id`'s stream; the other sequences are cleared as well, so
    /// the result is the same in both layouts.)
    fn llama_kv_cache_seq_keep(&self, py: Python<'_>, seq_id: i64) -> PyResult<()> {
        self.run(py, |native| {
            native.require_memory()?;
            let seq_id = native.seq(seq_id)?;
            native.with_mut(|context| context.llama_kv_cache_seq_keep(seq_id));
            if !native.kv_unified {
                for other in (0..native.n_seq_max).filter(|&other| i64::from(other) != i64::from(seq_id)) {
                    native.clear_seq(Some(i64::from(other)), None, None)?;
                }
            }
            Ok(())
        })
    }

    /// Adds `delta` to the positions of sequence `seq_id` in `[p0, p1)` (`None`: open end).
    /// `ValueError` when the cache cannot shift.
    fn kv_cache_seq_add(
        &self,
        py: Python<'_>,
        seq_id: i64,
        p0: Option<i64>,
        p1: Option<i64>,
        delta: i32,
    ) -> PyResult<()> {
        self.run(py, |native| {
            native.require_shift()?;
            let seq_id = native.seq(seq_id)?;
            let end = native.with(|context| context.kv_cache_seq_pos_max(seq_id));
            if i64::from(end) + i64::from(delta) > i64::from(MAX_POSITION) {
                return Err(Error::value(format!(
                    "shifting sequence {seq_id} (ending at position {end}) by {delta} would pass position {MAX_POSITION}"
                )));
            }
            let p0 = position(p0, KvCacheConversionError::P0TooLarge)?;
            let p1 = position(p1, KvCacheConversionError::P1TooLarge)?;
            Ok(native.with_mut(|context| context.kv_cache_seq_add(seq_id, p0, p1, delta))?)
        })
    }

    /// Divides the positions of sequence `seq_id` in `[p0, p1)` by `d` (1..=255).
    fn kv_cache_seq_div(&self, py: Python<'_>, seq_id: i64, p0: Option<i64>, p1: Option<i64>, d: i64) -> PyResult<()> {
        let d = u8::try_from(d)
            .ok()
            .and_then(NonZeroU8::new)
            .ok_or_else(|| Error::value(format!("d must be in 1..=255, got {d}")))?;
        self.run(py, |native| {
            native.require_shift()?;
            let seq_id = native.seq(seq_id)?;
            let p0 = position(p0, KvCacheConversionError::P0TooLarge)?;
            let p1 = position(p1, KvCacheConversionError::P1TooLarge)?;
            Ok(native.with_mut(|context| context.kv_cache_seq_div(seq_id, p0, p1, d))?)
        })
    }

    /// Largest position held for `seq_id`, or -1 when the sequence is empty.
    fn kv_cache_seq_pos_max(&self, py: Python<'_>, seq_id: i64) -> PyResult<i32> {
        self.run(py, |native| {
            native.require_memory()?;
            let seq_id = native.seq(seq_id)?;
            Ok(native.with(|context| context.kv_cache_seq_pos_max(seq_id)))
        })
    }

    /// Smallest position held for `seq_id`, or -1 when the sequence is empty.
    fn memory_seq_pos_min(&self, py: Python<'_>, seq_id: i64) -> PyResult<i32> {
        self.run(py, |native| {
            native.require_memory()?;
            let seq_id = native.seq(seq_id)?;
            Ok(native.with(|context| context.memory_seq_pos_min(seq_id)))
        })
    }

    /// Whether the KV cache supports shifting positions (`kv_cache_seq_add`/`_div`).
    fn memory_can_shift(&self, py: Python<'_>) -> PyResult<bool> {
        self.run(py, |native| Ok(native.can_shift()))
    }
}
