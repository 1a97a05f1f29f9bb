//! The host memory a new context will fill before its first decode, checked against what the
//! machine has available before llama.cpp allocates it.
//!
//! llama.cpp sizes its per-cell arrays and its KV cache from `n_ctx` and then writes every byte
//! of them (`llama_kv_cells::resize`, `ggml_backend_buffer_clear`). An allocation larger than
//! the machine fails cleanly, but one between the memory available and the overcommit limit
//! succeeds and is then touched: the kernel's OOM killer ends the process.

use std::fs;

use llama_cpp_4::model::LlamaModel;

use super::params::{cache_block_bytes, ContextOptions};
use crate::errors::{Error, Result};

/// What llama.cpp keeps per cell of a KV cache on the host: position, extra position,
/// shift and a bitset of `LLAMA_MAX_SEQ` (256) sequences [llama.cpp internal].
pub const CELL_BOOKKEEPING_BYTES: u64 = 4 + 8 + 4 + 256 / 8;

/// Refuses options whose context would need more memory than the machine has available. The
/// estimate errs low, so that it does not refuse a context that would fit: recurrent models
/// count nothing (their memory does not grow with `n_ctx`), sliding-window and hybrid models
/// only the cells' bookkeeping, and the head size is llama.cpp's default, `n_embd / n_head`.
pub fn check_host_memory(options: &ContextOptions, model: &LlamaModel) -> Result<()> {
    let Some(available) = available_bytes() else {
        return Ok(());
    };
    let needed = lower_bound_bytes(options, model)?;
    if needed <= available {
        return Ok(());
    }
    Err(Error::value(format!(
        "n_ctx={} needs at least {:.1} GiB for its KV cache, but only {:.1} GiB of memory is \
         available; use a smaller n_ctx (or a smaller cache_type_k/cache_type_v)",
        options.effective_n_ctx(model.n_ctx_train()),
        gib(needed),
        gib(available)
    )))
}

pub fn gib(bytes: u64) -> f64 {
    // Precision lost past 2**53 bytes does not show at one decimal of a GiB.
    #[allow(clippy::cast_precision_loss)]
    let bytes = bytes as f64;
    bytes / f64::from(1u32 << 30)
}

pub fn lower_bound_bytes(options: &ContextOptions, model: &LlamaModel) -> Result<u64> {
    if model.is_recurrent() {
        // One cell per sequence, whatever n_ctx says.
        return Ok(0);
    }
    let n_ctx = u64::from(options.effective_n_ctx(model.n_ctx_train()));
    let sliding = model.n_swa() > 0 && !options.swa_full.unwrap_or(false);
    let kv_cell_bytes = if model.is_hybrid() || sliding {
        0
    } else {
        let layers = u64::try_from(model.n_layer()).unwrap_or(0);
        let head_size = u64::try_from(model.n_embd() / model.n_head().max(1)).unwrap_or(0);
        let kv_values = u64::try_from(model.n_head_kv()).unwrap_or(0) * head_size;
        let block_bytes =
            cache_block_bytes(options.cache_type_k.as_deref())? + cache_block_bytes(options.cache_type_v.as_deref())?;
        layers * kv_values * block_bytes / 32
    };
    Ok(n_ctx.saturating_mul(kv_cell_bytes + CELL_BOOKKEEPING_BYTES))
}

/// `MemAvailable` from `/proc/meminfo`: what the kernel can give without swapping. `None` where
/// there is no such file (not Linux), which leaves the check to llama.cpp's own.
pub fn available_bytes() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}
