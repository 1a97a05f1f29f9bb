//! `LlamaContext`'s KV-cache methods (`open_context/kv.rs`).

use std::num::NonZeroU8;

use llama_cpp_4::context::kv_cache::KvCacheConversionError;
use pyo3::prelude::*;

use super::PyLlamaContext;
use crate::batch::MAX_POSITION;
use crate::errors::python::to_py;
use crate::errors::Error;
use crate::open_context::kv::position;

#[pymethods]
impl PyLlamaContext {
    /// Copies the first `size` positions of sequence `src` to sequence `dest`.
    fn copy_cache(&self, py: Python<'_>, src: i64, dest: i64, size: i64) -> PyResult<()> {
        let size = i32::try_from(size.max(-1)).map_err(|_| to_py(Error::value(format!("size {size} is too large"))))?;
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
            .ok_or_else(|| to_py(Error::value(format!("d must be in 1..=255, got {d}"))))?;
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
