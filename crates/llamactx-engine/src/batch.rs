//! A batch (`LlamaBatch` in Python: `python.rs`): tokens, positions and sequence ids for one
//! `decode`, checked as they are added and again against the context that decodes them.

use std::collections::{BTreeMap, BTreeSet};

use llama_cpp_4::llama_batch::{BatchAddError, LlamaBatch};
use llama_cpp_4::token::LlamaToken;

use crate::errors::{Error, Result};
use crate::tokens::check_vocab;

/// Most bytes one batch may allocate (llama.cpp's unchecked mallocs plus our bookkeeping): a
/// guard against a typo that would ask for many GiB and abort in `malloc`.
const MAX_BATCH_BYTES: usize = 1 << 30;

/// Bytes a batch takes per token (token, position, sequence count, sequence pointer, logits
/// flag, our token copy) and per token and sequence id.
const BYTES_PER_TOKEN: usize = 4 + 4 + 4 + 8 + 1 + 4;
const BYTES_PER_SEQ_ID: usize = 4;

/// The highest position a token may take: llama.cpp removes cells by half-open ranges that end
/// at `i32::MAX` at most, so a cell at `i32::MAX` could never be removed again.
pub const MAX_POSITION: i32 = i32::MAX - 1;

/// Where one sequence's tokens sit in a batch, gathered as they are added: what llama.cpp
/// checks before it decodes (positions continue the sequence without gaps or steps back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSpan {
    pub first: i32,
    pub last: i32,
    /// Distinct positions: equal neighbours count once, as in llama.cpp's position set.
    pub distinct: u32,
    /// The first step back (previous position, position), which llama.cpp refuses.
    pub step_back: Option<(i32, i32)>,
}

impl SeqSpan {
    fn start(pos: i32) -> Self {
        Self {
            first: pos,
            last: pos,
            distinct: 1,
            step_back: None,
        }
    }

    fn extend(&mut self, pos: i32) {
        if pos < self.last {
            self.step_back.get_or_insert((self.last, pos));
        } else if pos > self.last {
            self.distinct += 1;
            self.last = pos;
        }
    }
}

/// The crate's batch plus what it does not record but decoding must check.
pub struct BatchState {
    pub batch: LlamaBatch,
    capacity: usize,
    n_seq_max: usize,
    /// Token ids added so far, to check against the decoding context's vocabulary.
    pub tokens: Vec<i32>,
    /// The positions of each sequence added so far.
    pub spans: BTreeMap<i32, SeqSpan>,
    /// Pairs of sequences that share a token (the first id of the token, another id).
    pub couplings: BTreeSet<(i32, i32)>,
    /// Batch indices of the tokens that asked for logits.
    pub output_rows: Vec<i32>,
}

// SAFETY: `LlamaBatch` is `!Send` only because it holds the raw arrays `llama_batch_init`
// allocated; they belong to this batch alone and carry no thread affinity. `BatchState` is
// only reachable through the `OwnedMutex` of `PyLlamaBatch`.
unsafe impl Send for BatchState {}

impl BatchState {
    /// An empty batch of up to `n_tokens` tokens, each in up to `n_seq_max` sequences.
    pub fn new(n_tokens: usize, n_seq_max: usize) -> Result<Self> {
        if n_tokens == 0 || n_seq_max == 0 {
            return Err(Error::value("n_tokens and n_seq_max must be at least 1"));
        }
        let bytes = n_tokens.saturating_mul(BYTES_PER_TOKEN.saturating_add(n_seq_max.saturating_mul(BYTES_PER_SEQ_ID)));
        if bytes > MAX_BATCH_BYTES || i32::try_from(n_tokens).is_err() {
            return Err(Error::value(format!(
                "a batch of {n_tokens} tokens x {n_seq_max} sequences is too large ({bytes} bytes, limit \
                 {MAX_BATCH_BYTES})"
            )));
        }
        let seq_max = i32::try_from(n_seq_max).map_err(|_| Error::value("n_seq_max is too large"))?;
        Ok(Self {
            batch: LlamaBatch::new(n_tokens, seq_max),
            capacity: n_tokens,
            n_seq_max,
            tokens: Vec::with_capacity(n_tokens),
            spans: BTreeMap::new(),
            couplings: BTreeSet::new(),
            output_rows: Vec::new(),
        })
    }

    /// Empties the batch (its allocation is kept).
    /// The tokens the batch holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn clear(&mut self) {
        self.batch.clear();
        self.tokens.clear();
        self.output_rows.clear();
        self.spans.clear();
        self.couplings.clear();
    }

    /// Adds `token` of the one sequence `seq` at `position`, returning its row in the batch.
    /// Appends `ids` to sequence `seq_id` at positions 0, 1, ...; the last token always gets
    /// logits, the others when `logits_all`. All or nothing: `BatchAddError` when they do not
    /// all fit.
    pub fn add_sequence(&mut self, ids: &[i32], seq_id: i32, logits_all: bool) -> Result<()> {
        if self.tokens.len() + ids.len() > self.capacity {
            return Err(BatchAddError::InsufficientSpace(self.capacity).into());
        }
        let last = ids.len().saturating_sub(1);
        for (i, &id) in ids.iter().enumerate() {
            let pos = i32::try_from(i).map_err(|_| Error::value("sequence is too long"))?;
            self.add(id, pos, &[seq_id], logits_all || i == last)?;
        }
        Ok(())
    }

    pub fn add_at(&mut self, token: LlamaToken, position: usize, seq: i32, logits: bool) -> Result<i32> {
        let row = i32::try_from(self.tokens.len()).map_err(|_| Error::value("batch is too large"))?;
        let pos = i32::try_from(position).map_err(|_| Error::value(format!("position {position} is out of range")))?;
        self.add(token.0, pos, &[seq], logits)?;
        Ok(row)
    }

    pub fn add(&mut self, token: i32, pos: i32, seq_ids: &[i32], logits: bool) -> Result<()> {
        if seq_ids.is_empty() || seq_ids.len() > self.n_seq_max {
            return Err(Error::value(format!(
                "seq_ids must hold 1 to {} ids (the batch's n_seq_max), got {}",
                self.n_seq_max,
                seq_ids.len()
            )));
        }
        if let Some(bad) = seq_ids.iter().find(|&&id| id < 0) {
            return Err(Error::value(format!("sequence id {bad} is negative")));
        }
        if token < 0 {
            return Err(Error::value(format!("token id {token} is negative")));
        }
        if !(0..=MAX_POSITION).contains(&pos) {
            return Err(Error::value(format!("position {pos} is outside 0..={MAX_POSITION}")));
        }
        let row = i32::try_from(self.tokens.len()).map_err(|_| Error::value("batch is too large"))?;
        self.batch.add(LlamaToken::new(token), pos, seq_ids, logits)?;
        self.tokens.push(token);
        for &seq in seq_ids {
            self.spans
                .entry(seq)
                .and_modify(|span| span.extend(pos))
                .or_insert_with(|| SeqSpan::start(pos));
            if seq != seq_ids[0] {
                self.couplings.insert((seq_ids[0], seq));
            }
        }
        if logits {
            self.output_rows.push(row);
        }
        Ok(())
    }

    /// The distinct sequence ids of the batch, sorted.
    pub fn seq_ids(&self) -> Vec<i32> {
        self.spans.keys().copied().collect()
    }

    /// Checks the batch against a context before `llama_decode`/`llama_encode` see it.
    pub fn check_for(&self, n_vocab: i32, n_seq_max: u32, max_tokens: u32, limit_name: &str) -> Result<()> {
        if self.tokens.len() > max_tokens as usize {
            return Err(Error::value(format!(
                "batch holds {} tokens, more than the context's {limit_name} ({max_tokens}); split it",
                self.tokens.len()
            )));
        }
        if let Some(&max) = self
            .spans
            .keys()
            .next_back()
            .filter(|&&max| i64::from(max) >= i64::from(n_seq_max))
        {
            return Err(Error::value(format!(
                "sequence id {max} is out of range: the context holds {n_seq_max} sequences"
            )));
        }
        check_vocab(&self.tokens, n_vocab)
    }
}
