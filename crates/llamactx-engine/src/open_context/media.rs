//! Prompts with images or audio: `MtmdContext.eval_chunks` evaluated into a sequence, all or
//! nothing, with the checks and guards of every other decode.
//!
//! Text chunks go through `decode` like any batch. A media chunk is encoded by the projector,
//! then its embeddings are decoded by mtmd's helper, which knows each model's positions (M-RoPE)
//! and attention (some attend to an image's embeddings all at once).

use std::num::NonZeroI32;
use std::sync::Arc;

use llama_cpp_4::mtmd::{MtmdError, MtmdInputChunk};
use llama_cpp_4::DecodeError;

use super::rollback::Checkpoint;
use super::OpenContext;
use crate::batch::BatchState;
use crate::errors::{Error, Result};
use crate::media::{OpenMtmd, SharedChunks};

impl OpenContext {
    /// Evaluates `chunks` into `seq` from `n_past` (see `MtmdContext.eval_chunks`); the position
    /// after them.
    pub fn eval_chunks(
        &mut self,
        mtmd: &mut OpenMtmd,
        chunks: &SharedChunks,
        n_past: i32,
        seq: i32,
        logits_last: bool,
    ) -> Result<i32> {
        if !self.has_memory || self.has_encoder {
            return Err(Error::value(
                "images and audio are read by decoder-only models with a KV cache; this model is not one",
            ));
        }
        let n_seq_max = i32::try_from(self.n_seq_max).unwrap_or(i32::MAX);
        if !(0..n_seq_max).contains(&seq) {
            return Err(Error::value(format!("seq_id must be in 0..{n_seq_max}, got {seq}")));
        }
        if n_past < 0 {
            return Err(Error::value(format!("n_past must be >= 0, got {n_past}")));
        }
        let checkpoint = Checkpoint::of(seq, self.continuation_end(seq, n_past)?);
        let outcome = self.eval_each(mtmd, chunks, n_past, seq, logits_last);
        if outcome.is_err() {
            self.output_rows.clear();
            self.output_seqs.clear();
            self.roll_back(&checkpoint);
        }
        outcome
    }

    pub fn eval_each(
        &mut self,
        mtmd: &mut OpenMtmd,
        chunks: &SharedChunks,
        n_past: i32,
        seq: i32,
        logits_last: bool,
    ) -> Result<i32> {
        let mut position = n_past;
        for index in 0..chunks.len() {
            let chunk = chunks
                .get(index)
                .ok_or_else(|| Error::value(format!("chunk {index} is missing")))?;
            let wants_logits = logits_last && index + 1 == chunks.len();
            position = match chunk.text_tokens() {
                Some(tokens) => self.decode_text(tokens, position, seq, wants_logits)?,
                None => self.decode_media(mtmd, chunks, index, position, seq)?,
            };
        }
        Ok(position)
    }

    /// Decodes a text chunk in batches of `n_batch` tokens.
    pub fn decode_text(&mut self, tokens: &[i32], n_past: i32, seq: i32, wants_logits: bool) -> Result<i32> {
        let n_batch = usize::try_from(self.n_batch).unwrap_or(usize::MAX).max(1);
        let mut state = BatchState::new(n_batch.min(tokens.len().max(1)), 1)?;
        let mut position = n_past;
        for (slice_index, slice) in tokens.chunks(n_batch).enumerate() {
            state.clear();
            let last_slice = (slice_index + 1) * n_batch >= tokens.len();
            for (offset, &token) in slice.iter().enumerate() {
                let logits = wants_logits && last_slice && offset + 1 == slice.len();
                state.add(token, position, &[seq], logits)?;
                position = position
                    .checked_add(1)
                    .ok_or_else(|| Error::value("the prompt's positions pass i32"))?;
            }
            self.decode(&mut state)?;
        }
        Ok(position)
    }

    /// Encodes image or audio chunk `index` of `chunks` (or takes its kept embeddings) and
    /// decodes them.
    pub fn decode_media(
        &mut self,
        mtmd: &mut OpenMtmd,
        chunks: &SharedChunks,
        index: usize,
        n_past: i32,
        seq: i32,
    ) -> Result<i32> {
        let chunk = chunks
            .get(index)
            .ok_or_else(|| Error::value(format!("chunk {index} is missing")))?;
        let model = Arc::clone(self.model());
        let embeddings = {
            let _cpus = self.claim_cpus(chunk.n_tokens())?;
            mtmd.encoded(&model, &chunks.0, index)?
        };
        self.decode_encoded(mtmd, &chunk, &embeddings, n_past, seq)
    }

    /// Decodes the embeddings of media `chunk` (as the projector encoded it) into `seq` at
    /// `n_past`; the position after it. No outputs afterwards. On failure the sequence is left
    /// as it was (the helper's earlier micro-batches are removed).
    pub fn decode_encoded(
        &mut self,
        mtmd: &mut OpenMtmd,
        chunk: &MtmdInputChunk<'_>,
        embeddings: &[f32],
        n_past: i32,
        seq: i32,
    ) -> Result<i32> {
        let n_tokens = chunk.n_tokens();
        let n_batch = if mtmd.native.decode_use_non_causal(chunk) {
            // llama.cpp asserts when a non-causal decode spans several micro-batches.
            if n_tokens > usize::try_from(self.n_ubatch).unwrap_or(usize::MAX) {
                return Err(Error::value(format!(
                    "this model reads the {n_tokens} embeddings of an image at once: create the context with \
                     n_ubatch >= {n_tokens}"
                )));
            }
            self.n_ubatch
        } else {
            self.n_batch
        };
        let n_batch = i32::try_from(n_batch.max(1)).unwrap_or(i32::MAX);
        let checkpoint = Checkpoint::of(seq, self.continuation_end(seq, n_past)?);
        let mut after = n_past;
        self.output_rows.clear();
        self.output_seqs.clear();
        let outcome = self.run_guarded(n_tokens, |context| {
            mtmd.native
                .decode_image_chunk(context, chunk, embeddings, n_past, seq, n_batch, &mut after)
                .map_err(decode_failure)
        });
        if outcome.is_err() {
            self.roll_back(&checkpoint);
        }
        outcome.map(|()| after)
    }
}

/// The helper's failure as the `DecodeError` of the `llama_decode` it reports (its other
/// failures cannot happen: the chunk is media).
pub fn decode_failure(err: MtmdError) -> Error {
    match err {
        MtmdError::EvalError(code) => NonZeroI32::new(code).map_or_else(
            || Error::from(MtmdError::EvalError(code)),
            |code| Error::from(DecodeError::from(code)),
        ),
        other => Error::from(other),
    }
}
