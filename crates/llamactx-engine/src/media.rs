//! Images and audio in prompts: the crate's `mtmd` module (llama.cpp's multimodal library) under
//! its names. `MtmdContext` is a projector (mmproj GGUF) loaded for one text model; it tokenizes
//! prompts with media into `MtmdInputChunks` and evaluates them into a `LlamaContext`.
//!
//! Image files are decoded by Rust decoders under limits (`image_file`), never by mtmd's
//! stb_image; only pixels and float samples reach llama.cpp.

pub mod audio_file;
pub mod chunks;
pub mod image_file;
pub mod kept_encodings;
pub mod projector_file;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::mtmd::{MtmdContext, MtmdInputChunks};

pub use chunks::SharedChunks;
use kept_encodings::{KeptEncodings, MediaKey};

use crate::backend::explained;
use crate::errors::{Error, Result};

/// Numbers each `MtmdContext`, so that chunks know which one made them.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A projector, open.
pub struct OpenMtmd {
    pub native: MtmdContext,
    /// Image and audio chunks encoded so far.
    pub encodes: u64,
    /// The embeddings of recently encoded media chunks.
    kept: KeptEncodings,
}

impl OpenMtmd {
    /// The embeddings of media chunk `index` of `chunks`: encoded now, or kept from an earlier
    /// encode of the same chunk of the same media (`kept_encodings`). `model` is the text
    /// model, whose width they have.
    pub fn encoded(&mut self, model: &LlamaModel, chunks: &MtmdInputChunks, index: usize) -> Result<Arc<Vec<f32>>> {
        let chunk = chunks
            .get(index)
            .ok_or_else(|| Error::value(format!("chunk {index} is missing")))?;
        let key = MediaKey::of(chunks, index);
        if let Some(kept) = key.as_ref().and_then(|key| self.kept.get(key)) {
            return Ok(kept);
        }
        explained(|| self.native.encode_chunk(model, &chunk))?;
        self.encodes += 1;
        let embeddings = Arc::new(self.native.output_embd().to_vec());
        if let Some(key) = key {
            self.kept.keep(key, Arc::clone(&embeddings));
        }
        Ok(embeddings)
    }
}

/// A projector shared by its Python handle (`MtmdContext`) and the engines that read media
/// with it.
pub struct SharedMtmd {
    native: Mutex<Option<OpenMtmd>>,
    /// Dropped after `native` (field order): mtmd keeps pointers into the text model.
    text_model: Arc<LlamaModel>,
    id: u64,
}

impl SharedMtmd {
    /// `native`, a projector llama.cpp loaded for `text_model`, shared.
    pub fn new(native: MtmdContext, text_model: Arc<LlamaModel>) -> Self {
        Self {
            native: Mutex::new(Some(OpenMtmd {
                native,
                encodes: 0,
                kept: KeptEncodings::default(),
            })),
            text_model,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The open projector, locked.
    pub fn lock(&self) -> Result<MutexGuard<'_, Option<OpenMtmd>>> {
        let guard = self.native.lock().map_err(|_| Error::Poisoned("MtmdContext"))?;
        if guard.is_none() {
            return Err(Error::closed("MtmdContext"));
        }
        Ok(guard)
    }

    /// The open projector, locked, or None while another thread holds it (encoding an image).
    pub fn try_lock(&self) -> Result<Option<MutexGuard<'_, Option<OpenMtmd>>>> {
        match self.native.try_lock() {
            Ok(guard) if guard.is_none() => Err(Error::closed("MtmdContext")),
            Ok(guard) => Ok(Some(guard)),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Poisoned(_)) => Err(Error::Poisoned("MtmdContext")),
        }
    }

    /// The projector's identity in the chunks it makes.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether it is the projector of `model`.
    pub fn is_for(&self, model: &Arc<LlamaModel>) -> bool {
        Arc::ptr_eq(&self.text_model, model)
    }

    /// `ValueError` unless chunks `made_by` a projector were tokenized by this one.
    pub fn check_made(&self, made_by: u64) -> Result<()> {
        if made_by == self.id {
            Ok(())
        } else {
            Err(Error::value(
                "these chunks were tokenized by another MtmdContext: its projector prepared their media",
            ))
        }
    }

    /// Reads the open projector with `read`.
    pub fn read<T>(&self, read: impl FnOnce(&MtmdContext) -> T) -> Result<T> {
        let guard = self.lock()?;
        let open = guard.as_ref().ok_or_else(|| Error::closed("MtmdContext"))?;
        Ok(read(&open.native))
    }

    /// Frees the projector now; later uses are `ValueError`.
    pub fn close(&self) -> Result<()> {
        let mut guard = self.native.lock().map_err(|_| Error::Poisoned("MtmdContext"))?;
        guard.take();
        Ok(())
    }
}
