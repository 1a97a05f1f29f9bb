//! All-or-nothing decodes.
//!
//! llama.cpp splits a batch into micro-batches and, when one fails or is aborted, removes only
//! that micro-batch from the KV cache: the ones before it stay. Before a decode we check that
//! the batch continues each of its sequences (so everything it adds lies after the sequence's
//! current end) and remember those ends; after a failure we cut every touched sequence back to
//! its end, which leaves its positions and cells as they were before the call.

use super::OpenContext;
use crate::batch::BatchState;
use crate::errors::{Error, Result};

/// Rope types with several positions per token, whose positions may jump forward (llama.cpp's
/// M-RoPE rule in `llama_batch_allocr::init`; the checks below copy that function's)
/// [llama.cpp internal].
pub const MULTI_POSITION_ROPE_TYPES: [llama_cpp_sys_4::llama_rope_type; 3] = [
    llama_cpp_sys_4::LLAMA_ROPE_TYPE_MROPE,
    llama_cpp_sys_4::LLAMA_ROPE_TYPE_IMROPE,
    llama_cpp_sys_4::LLAMA_ROPE_TYPE_VISION,
];

/// Where each sequence a batch touches ended in the KV cache before the decode.
pub struct Checkpoint {
    ends: Vec<(i32, i32)>,
}

impl Checkpoint {
    /// The checkpoint of one sequence that ends at `end`.
    pub fn of(seq: i32, end: i32) -> Self {
        Self { ends: vec![(seq, end)] }
    }
}

impl OpenContext {
    /// Refuses, with a `ValueError` naming the sequence and positions, a batch whose positions
    /// llama.cpp would refuse with its catch-all -1, and records where each sequence ends.
    /// `memory` is false for computations that do not write the KV cache (encoders).
    pub fn checkpoint(&self, batch: &BatchState, memory: bool) -> Result<Checkpoint> {
        let memory = memory && self.has_memory;
        let may_jump = MULTI_POSITION_ROPE_TYPES.contains(&self.model().rope_type());
        let mut ends = Vec::with_capacity(batch.spans.len());
        for (&seq, span) in &batch.spans {
            if let Some((previous, pos)) = span.step_back {
                return Err(Error::value(format!(
                    "the batch's positions of sequence {seq} go back from {previous} to {pos}: add each \
                     sequence's tokens in increasing positions"
                )));
            }
            let end = if memory {
                self.continuation_end(seq, span.first)?
            } else {
                -1
            };
            if !may_jump {
                let covered = i64::from(span.last) - i64::from(span.first) + 1;
                if covered > i64::from(span.distinct) {
                    return Err(Error::value(format!(
                        "the batch's positions of sequence {seq} have gaps: {} positions between {} and {}",
                        span.distinct, span.first, span.last
                    )));
                }
            }
            ends.push((seq, end));
        }
        if memory {
            self.check_couplings(batch)?;
        }
        Ok(Checkpoint { ends })
    }

    /// Where `seq` ends in the KV cache (-1: empty), refusing with a `ValueError` a computation
    /// that would not continue it at `first`: right after its end, or anywhere after it for
    /// models with several positions per token.
    pub fn continuation_end(&self, seq: i32, first: i32) -> Result<i32> {
        let end = self.with(|context| context.kv_cache_seq_pos_max(seq));
        if MULTI_POSITION_ROPE_TYPES.contains(&self.model().rope_type()) {
            if end >= 0 && first <= end {
                return Err(Error::value(format!(
                    "sequence {seq} ends at position {end} in the KV cache; the batch must continue it \
                     after {end}, not at {first}"
                )));
            }
        } else if end >= 0 && i64::from(first) != i64::from(end) + 1 {
            return Err(Error::value(format!(
                "sequence {seq} ends at position {end} in the KV cache, so the batch must continue it \
                 at {}, not at {first} (remove the cached positions first to rewrite them)",
                i64::from(end) + 1
            )));
        }
        Ok(end)
    }

    /// Sequences that share a token need one KV stream for all sequences, and the same cached
    /// range (llama.cpp: "sequential split is not supported when there are coupled sequences",
    /// "coupled ... but have diverged").
    pub fn check_couplings(&self, batch: &BatchState) -> Result<()> {
        if let Some(&(a, b)) = batch.couplings.iter().next().filter(|_| !self.kv_unified) {
            return Err(Error::value(format!(
                "a token of the batch belongs to sequences {a} and {b}, which needs one KV stream for all \
                 sequences: create the context with kv_unified=True, or decode into one sequence and copy \
                 it with copy_kv_cache_seq"
            )));
        }
        for &(a, b) in &batch.couplings {
            let range = |seq| self.with(|context| (context.memory_seq_pos_min(seq), context.kv_cache_seq_pos_max(seq)));
            let (range_a, range_b) = (range(a), range(b));
            if range_a != range_b {
                return Err(Error::value(format!(
                    "sequences {a} and {b} share tokens in the batch but hold different positions in the KV \
                     cache ({a}: {}..={}, {b}: {}..={}); copy one onto the other first",
                    range_a.0, range_a.1, range_b.0, range_b.1
                )));
            }
        }
        Ok(())
    }

    /// Removes from the KV cache whatever a failed decode left past each sequence's old end.
    pub fn roll_back(&mut self, checkpoint: &Checkpoint) {
        if !self.has_memory {
            return;
        }
        for &(seq, end) in &checkpoint.ends {
            let (Ok(seq), Ok(start)) = (u32::try_from(seq), u32::try_from(i64::from(end) + 1)) else {
                continue;
            };
            // The range is valid by construction (a sequence in range, a start from -1 + 1 up):
            // the crate only fails on values past i32, which `checkpoint` never records.
            let _ = self.with_mut(|context| context.clear_kv_cache_seq(Some(seq), Some(start), None));
        }
    }
}
