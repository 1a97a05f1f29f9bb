//! `Engine::stats()`: what the engine holds and has done, as a typed value.

/// Declares `EngineStats`' fields once: the struct below, and the getters of the Python class
/// and its `repr` (`python.rs`).
#[macro_export]
macro_rules! engine_stats_fields {
    ($declare:ident) => {
        $declare! {
            /// Requests generating now.
            running: usize,
            /// Requests waiting for a sequence.
            waiting: usize,
            /// KV cells the running requests hold.
            kv_cells_used: usize,
            /// KV cells kept for prefix reuse (no request holds them).
            kv_cells_cached: usize,
            /// The context's KV cells (`n_ctx`).
            kv_cells_total: u32,
            /// Sequences: requests that can run at once.
            n_seq_max: u32,
            /// Requests that reused cached prompt tokens.
            prefix_cache_hits: u64,
            /// Tokens generated.
            tokens_generated: u64,
            /// Prompt tokens decoded (not reused).
            prompt_tokens_computed: u64,
            /// Tokens proposed by speculative drafts and verified.
            drafted_tokens: u64,
            /// Drafted tokens the model accepted.
            accepted_tokens: u64,
            /// Tokens generated per second of engine work (0 before any).
            tokens_per_second: f64,
        }
    };
}

/// What `EngineStats` is, for the Rust struct and the Python class alike.
#[macro_export]
macro_rules! engine_stats_doc {
    () => {
        "An engine's counts at one moment (`Engine.stats()`): requests running and waiting, KV cells \
         used by running requests, kept for prefix reuse and in total, the sequences, prefix-cache \
         hits, tokens generated and prompt tokens computed, speculative tokens drafted and accepted, \
         and generated tokens per second of engine work."
    };
}

macro_rules! declare_engine_stats {
    ($($(#[doc = $doc:literal])* $name:ident: $kept:ty,)*) => {
        #[doc = engine_stats_doc!()]
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub struct EngineStats {
            $($(#[doc = $doc])* pub $name: $kept,)*
        }
    };
}
engine_stats_fields!(declare_engine_stats);
