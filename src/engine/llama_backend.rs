//! The engine's `Backend` on llama.cpp: its context, the batch its decodes go through, and the
//! projector that image and audio prompts are encoded by.

use llama_cpp_4::token::LlamaToken;
use pyo3::Py;

use super::backend::{Backend, Entry, Sizes};
use super::prefix_cache::Adapter;
use super::scheduler::MediaSpan;
use crate::batch::BatchState;
use crate::context::OpenContext;
use crate::errors::{Error, Result};
use crate::media::PyMtmdContext;
use crate::steps::token_bytes;
use crate::tokens::{check_vocab, to_llama_tokens};

pub struct LlamaBackend {
    native: OpenContext,
    batch: BatchState,
    sizes: Sizes,
    /// The projector whose embeddings media prompts decode, if the engine reads media.
    mtmd: Option<Py<PyMtmdContext>>,
    /// The adapter's scale the context has now.
    adapter: Adapter,
}

impl LlamaBackend {
    /// Decodes go through `batch` (of `n_batch` tokens); `adapter_scale` is that of the adapter
    /// set on `native`, if any.
    pub fn new(
        native: OpenContext,
        batch: BatchState,
        mtmd: Option<Py<PyMtmdContext>>,
        adapter_scale: Option<f32>,
    ) -> Self {
        let (n_batch, n_ctx, n_seq_max) = native.with(|context| {
            (
                context.n_batch() as usize,
                context.n_ctx() as usize,
                context.n_seq_max() as usize,
            )
        });
        let sizes = Sizes {
            n_batch,
            n_ctx,
            n_seq_max,
            n_ctx_seq: native.positions_per_sequence() as usize,
            kv_unified: native.kv_unified(),
            n_vocab: native.model().n_vocab(),
        };
        Self {
            native,
            batch,
            sizes,
            mtmd,
            adapter: adapter_scale.map(f32::to_bits),
        }
    }
}

/// A position or row as llama.cpp takes it.
fn index(value: usize) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::value(format!("position {value} is out of range")))
}

impl Backend for LlamaBackend {
    fn sizes(&self) -> Sizes {
        self.sizes
    }

    fn decode(&mut self, entries: &[Entry]) -> Result<()> {
        self.batch.clear();
        for entry in entries {
            self.batch
                .add_at(entry.token, entry.position, entry.seq, entry.output)?;
        }
        self.native.decode(&mut self.batch)
    }

    fn finish_compute(&mut self) {
        self.native.with_mut(|context| context.synchronize());
    }

    fn read_logits<T: Send>(&self, row: usize, read: impl FnOnce(&[f32]) -> T) -> Result<T> {
        let row = i32::try_from(row).map_err(|_| Error::index(format!("output row {row} is out of range")))?;
        self.native
            .read_row(row, |context, row| read(context.get_logits_ith(row)))
    }

    fn clear_cells(&mut self, seq: i32, from: usize, to: Option<usize>) -> Result<bool> {
        let to = to.map(index).transpose()?;
        self.native.clear_seq(Some(i64::from(seq)), Some(index(from)?), to)
    }

    fn copy_cells(&mut self, source: i32, dest: i32, to: Option<usize>) -> Result<()> {
        let range = match to {
            Some(to) => (Some(0), Some(index(to)?)),
            None => (None, None),
        };
        self.native
            .copy_seq(i64::from(source), i64::from(dest), range.0, range.1)
    }

    fn save_seq(&mut self, seq: i32, tokens: &[LlamaToken]) -> Result<Vec<u8>> {
        self.native.seq_state_file(seq, tokens)
    }

    fn restore_seq(&mut self, seq: i32, file: &[u8]) -> Result<Vec<LlamaToken>> {
        let restored = self
            .native
            .restore_seq_state_file(file, seq, self.sizes.n_ctx_seq)
            .and_then(|ids| {
                check_vocab(&ids, self.sizes.n_vocab)?;
                // The cells must be the tokens' positions, from 0, for the prefix cache to
                // reuse them as those tokens.
                let span = self
                    .native
                    .with(|context| (context.memory_seq_pos_min(seq), context.kv_cache_seq_pos_max(seq)));
                let expected = match i32::try_from(ids.len()) {
                    Ok(0) => (-1, -1),
                    Ok(count) => (0, count - 1),
                    Err(_) => (0, i32::MAX),
                };
                if span != expected {
                    return Err(Error::state(
                        "SeqLoadFile",
                        format!(
                            "the state holds positions {span:?}, not those of its {} tokens",
                            ids.len()
                        ),
                    ));
                }
                Ok(to_llama_tokens(&ids))
            });
        if restored.is_err() {
            self.native.clear_seq(Some(i64::from(seq)), None, None)?;
        }
        restored
    }

    fn adapter(&self) -> Adapter {
        self.adapter
    }

    fn set_adapter_scale(&mut self, scale: f32) -> Result<()> {
        self.native.set_lora_scale(scale)?;
        self.adapter = Some(scale.to_bits());
        Ok(())
    }

    fn is_end_of_generation(&self, token: LlamaToken) -> bool {
        self.native.model().is_eog_token(token)
    }

    fn token_bytes(&self, token: LlamaToken) -> Result<Vec<u8>> {
        token_bytes(self.native.model(), token)
    }

    fn reads_media(&self) -> bool {
        self.mtmd.is_some()
    }

    fn decode_media(&mut self, span: &MediaSpan, seq: i32, wait: bool) -> Result<bool> {
        let mtmd = self
            .mtmd
            .as_ref()
            .ok_or_else(|| Error::value("this engine reads no media (it has no MtmdContext)"))?
            .get();
        let mut guard = match mtmd.try_lock()? {
            Some(guard) => guard,
            None if !wait => return Ok(false),
            None => mtmd.lock()?,
        };
        let open = guard.as_mut().ok_or_else(|| Error::closed("MtmdContext"))?;
        let chunk = span
            .chunks
            .0
            .get(span.index)
            .ok_or_else(|| Error::value("an image chunk is missing"))?;
        let position = i32::try_from(span.at).map_err(|_| Error::value("the prompt is too long"))?;
        self.native
            .decode_encoded(open, &chunk, &span.embeddings, position, seq)
            .map(|_| true)
    }
}
