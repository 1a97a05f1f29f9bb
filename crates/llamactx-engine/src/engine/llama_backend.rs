//! The engine's `Backend` on llama.cpp: its context, the batch its decodes go through, and the
//! projector that image and audio prompts are encoded by. The engine owns its context; the
//! step loop on a caller's `LlamaContext` (`context_loop.rs`) locks the caller's for each call
//! (its `Native`).

use std::sync::Arc;

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::token::LlamaToken;

use super::backend::{Backend, Entry, Sizes};
use super::prefix_cache::Adapter;
use super::scheduler::MediaSpan;
use crate::batch::BatchState;
use crate::errors::{Error, Result};
use crate::media::SharedMtmd;
use crate::open_context::OpenContext;
use crate::steps::token_bytes;
use crate::tokens::{check_vocab, to_llama_tokens};

/// How the backend reaches its llama.cpp context.
pub trait Native {
    fn open<T>(&self, work: impl FnOnce(&OpenContext) -> Result<T>) -> Result<T>;
    fn open_mut<T>(&mut self, work: impl FnOnce(&mut OpenContext) -> Result<T>) -> Result<T>;
}

/// The engine's own context.
impl Native for OpenContext {
    fn open<T>(&self, work: impl FnOnce(&OpenContext) -> Result<T>) -> Result<T> {
        work(self)
    }

    fn open_mut<T>(&mut self, work: impl FnOnce(&mut OpenContext) -> Result<T>) -> Result<T> {
        work(self)
    }
}

pub struct LlamaBackend<N: Native> {
    native: N,
    /// The model `native` runs, for what a token is.
    model: Arc<LlamaModel>,
    batch: BatchState,
    sizes: Sizes,
    /// The projector whose embeddings media prompts decode, if the engine reads media.
    mtmd: Option<Arc<SharedMtmd>>,
    /// The adapter's scale the context has now.
    adapter: Adapter,
}

impl<N: Native> LlamaBackend<N> {
    /// Decodes go through `batch` (of `n_batch` tokens); `adapter_scale` is that of the adapter
    /// set on `native`, if any.
    pub fn new(
        native: N,
        batch: BatchState,
        mtmd: Option<Arc<SharedMtmd>>,
        adapter_scale: Option<f32>,
    ) -> Result<Self> {
        let (sizes, model) = native.open(|open| {
            let sizes = open.with(|context| Sizes {
                n_batch: context.n_batch() as usize,
                n_ctx: context.n_ctx() as usize,
                n_seq_max: context.n_seq_max() as usize,
                n_ctx_seq: open.positions_per_sequence() as usize,
                kv_unified: open.kv_unified(),
                n_vocab: open.model().n_vocab(),
            });
            Ok((sizes, Arc::clone(open.model())))
        })?;
        Ok(Self {
            native,
            model,
            batch,
            sizes,
            mtmd,
            adapter: adapter_scale.map(f32::to_bits),
        })
    }
}

/// A position or row as llama.cpp takes it.
fn index(value: usize) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::value(format!("position {value} is out of range")))
}

impl<N: Native> Backend for LlamaBackend<N> {
    fn sizes(&self) -> Sizes {
        self.sizes
    }

    fn decode(&mut self, entries: &[Entry]) -> Result<()> {
        self.batch.clear();
        for entry in entries {
            self.batch
                .add_at(entry.token, entry.position, entry.seq, entry.output)?;
        }
        let batch = &mut self.batch;
        self.native.open_mut(|native| native.decode(batch))
    }

    fn finish_compute(&mut self) {
        let _ = self.native.open_mut(|native| {
            native.with_mut(|context| context.synchronize());
            Ok(())
        });
    }

    fn read_logits<T: Send>(&self, row: usize, read: impl FnOnce(&[f32]) -> T) -> Result<T> {
        let row = i32::try_from(row).map_err(|_| Error::index(format!("output row {row} is out of range")))?;
        self.native
            .open(|native| native.read_row(row, |context, row| read(context.get_logits_ith(row))))
    }

    fn clear_cells(&mut self, seq: i32, from: usize, to: Option<usize>) -> Result<bool> {
        let to = to.map(index).transpose()?;
        let from = index(from)?;
        self.native
            .open_mut(|native| native.clear_seq(Some(i64::from(seq)), Some(from), to))
    }

    fn copy_cells(&mut self, source: i32, dest: i32, to: Option<usize>) -> Result<()> {
        let range = match to {
            Some(to) => (Some(0), Some(index(to)?)),
            None => (None, None),
        };
        self.native
            .open_mut(|native| native.copy_seq(i64::from(source), i64::from(dest), range.0, range.1))
    }

    fn save_seq(&mut self, seq: i32, tokens: &[LlamaToken]) -> Result<Vec<u8>> {
        self.native.open_mut(|native| native.seq_state_file(seq, tokens))
    }

    fn restore_seq(&mut self, seq: i32, file: &[u8]) -> Result<Vec<LlamaToken>> {
        let (n_ctx_seq, n_vocab) = (self.sizes.n_ctx_seq, self.sizes.n_vocab);
        self.native.open_mut(|native| {
            let restored = native.restore_seq_state_file(file, seq, n_ctx_seq).and_then(|ids| {
                check_vocab(&ids, n_vocab)?;
                // The cells must be the tokens' positions, from 0, for the prefix cache to
                // reuse them as those tokens.
                let span = native.with(|context| (context.memory_seq_pos_min(seq), context.kv_cache_seq_pos_max(seq)));
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
                native.clear_seq(Some(i64::from(seq)), None, None)?;
            }
            restored
        })
    }

    fn last_row(&self) -> Result<usize> {
        let row = self.native.open(|native| native.full_logits_row(-1))?;
        usize::try_from(row).map_err(|_| Error::index(format!("output row {row} is out of range")))
    }

    fn adapter(&self) -> Adapter {
        self.adapter
    }

    fn set_adapter_scale(&mut self, scale: f32) -> Result<()> {
        self.native.open_mut(|native| native.set_lora_scale(scale))?;
        self.adapter = Some(scale.to_bits());
        Ok(())
    }

    fn is_end_of_generation(&self, token: LlamaToken) -> bool {
        self.model.is_eog_token(token)
    }

    fn token_bytes(&self, token: LlamaToken) -> Result<Vec<u8>> {
        token_bytes(&self.model, token)
    }

    fn reads_media(&self) -> bool {
        self.mtmd.is_some()
    }

    fn decode_media(&mut self, span: &MediaSpan, seq: i32, wait: bool) -> Result<bool> {
        let mtmd = self
            .mtmd
            .as_ref()
            .ok_or_else(|| Error::value("this engine reads no media (it has no MtmdContext)"))?;
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
            .open_mut(|native| native.decode_encoded(open, &chunk, &span.embeddings, position, seq))
            .map(|_| true)
    }
}
