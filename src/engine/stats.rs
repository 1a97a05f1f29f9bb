//! `Engine.stats()`: what the engine holds and has done, as a typed value.

use pyo3::prelude::*;

/// An engine's counts at one moment (`Engine.stats()`): requests running and waiting, KV cells
/// used by running requests, kept for prefix reuse and in total, the sequences, prefix-cache
/// hits, tokens generated and prompt tokens computed, speculative tokens drafted and accepted,
/// and generated tokens per second of engine work.
#[pyclass(frozen, get_all, module = "llamactx", name = "EngineStats")]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PyEngineStats {
    /// Requests generating now.
    pub running: usize,
    /// Requests waiting for a sequence.
    pub waiting: usize,
    /// KV cells the running requests hold.
    pub kv_cells_used: usize,
    /// KV cells kept for prefix reuse (no request holds them).
    pub kv_cells_cached: usize,
    /// The context's KV cells (`n_ctx`).
    pub kv_cells_total: u32,
    /// Sequences: requests that can run at once.
    pub n_seq_max: u32,
    /// Requests that reused cached prompt tokens.
    pub prefix_cache_hits: u64,
    /// Tokens generated.
    pub tokens_generated: u64,
    /// Prompt tokens decoded (not reused).
    pub prompt_tokens_computed: u64,
    /// Tokens proposed by speculative drafts and verified.
    pub drafted_tokens: u64,
    /// Drafted tokens the model accepted.
    pub accepted_tokens: u64,
    /// Tokens generated per second of engine work (0 before any).
    pub tokens_per_second: f64,
}

#[pymethods]
impl PyEngineStats {
    fn __repr__(&self) -> String {
        format!(
            "EngineStats(running={}, waiting={}, kv_cells_used={}, kv_cells_cached={}, kv_cells_total={}, \
             n_seq_max={}, prefix_cache_hits={}, tokens_generated={}, prompt_tokens_computed={}, \
             drafted_tokens={}, accepted_tokens={}, tokens_per_second={})",
            self.running,
            self.waiting,
            self.kv_cells_used,
            self.kv_cells_cached,
            self.kv_cells_total,
            self.n_seq_max,
            self.prefix_cache_hits,
            self.tokens_generated,
            self.prompt_tokens_computed,
            self.drafted_tokens,
            self.accepted_tokens,
            self.tokens_per_second
        )
    }
}
