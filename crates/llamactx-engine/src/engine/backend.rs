//! What the scheduler asks of a model and its context: decode a batch, read an output row,
//! cut, copy, save and restore a sequence's cells, and what a token is. The engine runs on llama.cpp's
//! context (`llama_backend.rs`); the scheduler's unit tests run on a scripted model
//! (`scripted.rs`), so its decisions are tested without loading one.

use llama_cpp_4::token::LlamaToken;

use super::prefix_cache::Adapter;
use super::scheduler::MediaSpan;
use crate::errors::Result;

/// One token of a decode: `token` at `position` of sequence `seq`, with an output row (the
/// entry's index in the decode) when `output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub token: LlamaToken,
    pub position: usize,
    pub seq: i32,
    pub output: bool,
}

/// The sizes the scheduler plans with.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Tokens one decode takes.
    pub n_batch: usize,
    /// KV cells in all.
    pub n_ctx: usize,
    pub n_seq_max: usize,
    /// Cells (positions) one sequence may use.
    pub n_ctx_seq: usize,
    /// Whether all sequences share one KV stream (a copy can then take part of a sequence).
    pub kv_unified: bool,
    pub n_vocab: i32,
}

pub trait Backend {
    fn sizes(&self) -> Sizes;

    /// Decodes `entries` in one batch. On failure nothing changed.
    fn decode(&mut self, entries: &[Entry]) -> Result<()>;

    /// Waits until the last decode is computed (a GPU's returns before), for timing it.
    fn finish_compute(&mut self);

    /// Reads the logits of output row `row` of the last decode.
    fn read_logits<T: Send>(&self, row: usize, read: impl FnOnce(&[f32]) -> T) -> Result<T>;

    /// The output row of the last token of the last decode, whoever made it: a request that
    /// starts on a sequence its caller read samples its first token there (`scheduler::Held`).
    fn last_row(&self) -> Result<usize>;

    /// Removes the cells of `seq` from position `from` on (to `to`, or the end). False where
    /// the memory cannot cut a sequence (recurrent state).
    fn clear_cells(&mut self, seq: i32, from: usize, to: Option<usize>) -> Result<bool>;

    /// Copies the cells of `source` into `dest`: those before `to`, or all of them.
    fn copy_cells(&mut self, source: i32, dest: i32, to: Option<usize>) -> Result<()>;

    /// Sequence `seq`'s cells as llama.cpp's sequence state file, naming `tokens` as what they
    /// hold.
    fn save_seq(&mut self, seq: i32, tokens: &[LlamaToken]) -> Result<Vec<u8>>;

    /// Replaces sequence `seq`'s cells with a sequence state file's and returns its tokens: the
    /// cells are then exactly those tokens' positions, from 0. On failure `seq` is left empty.
    fn restore_seq(&mut self, seq: i32, file: &[u8]) -> Result<Vec<LlamaToken>>;

    /// The LoRA adapter's scale the context decodes with now (None: it has no adapter).
    fn adapter(&self) -> Adapter;

    /// Decodes with the context's adapter at `scale` from now on.
    fn set_adapter_scale(&mut self, scale: f32) -> Result<()>;

    fn is_end_of_generation(&self, token: LlamaToken) -> bool;

    /// The bytes `token` stands for in generated text.
    fn token_bytes(&self, token: LlamaToken) -> Result<Vec<u8>>;

    /// Whether prompts may hold media (a projector was given).
    fn reads_media(&self) -> bool;

    /// Decodes the embeddings of `span` into `seq` at its position: true when decoded; false,
    /// with nothing done, when the projector is busy encoding and `wait` is false.
    fn decode_media(&mut self, span: &MediaSpan, seq: i32, wait: bool) -> Result<bool>;
}
