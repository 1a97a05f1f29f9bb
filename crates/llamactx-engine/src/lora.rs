//! A LoRA adapter loaded for one model (`LlamaLoraAdapter` in Python: `python.rs`).
//!
//! llama.cpp frees an adapter with its model, and `llama_adapter_lora_free` reaches into the
//! model, so an adapter must be freed before its model: the adapter holds an `Arc` of the
//! model, declared after the adapter so that it drops last. Contexts that set the adapter
//! hold a lease on it, and `close()` refuses while any lease exists.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::errors::{Error, Result};
use llama_cpp_4::model::{LlamaLoraAdapter, LlamaModel};

pub struct SendAdapter(pub LlamaLoraAdapter);

// SAFETY: `LlamaLoraAdapter` is `!Send` only for its raw pointer. An adapter is read-only
// weights after loading; every mutable use goes through the `Mutex` that holds it.
unsafe impl Send for SendAdapter {}

/// A LoRA adapter for one model, shared by its handle and the contexts that set it.
pub struct LoraAdapter {
    adapter: Mutex<Option<SendAdapter>>,
    /// Dropped after `adapter` (field order): the adapter must not outlive its model.
    model: Arc<LlamaModel>,
    leases: AtomicUsize,
    path: PathBuf,
}

impl LoraAdapter {
    pub fn new(adapter: LlamaLoraAdapter, model: Arc<LlamaModel>, path: PathBuf) -> Self {
        Self {
            adapter: Mutex::new(Some(SendAdapter(adapter))),
            model,
            leases: AtomicUsize::new(0),
            path,
        }
    }

    pub fn model(&self) -> &Arc<LlamaModel> {
        &self.model
    }

    /// The open adapter, locked.
    pub fn lock(&self) -> Result<MutexGuard<'_, Option<SendAdapter>>> {
        let guard = self.adapter.lock().map_err(|_| Error::Poisoned("LlamaLoraAdapter"))?;
        if guard.is_none() {
            return Err(Error::closed("LlamaLoraAdapter"));
        }
        Ok(guard)
    }

    /// The adapter itself (None once closed), for closing it.
    pub fn slot(&self) -> &Mutex<Option<SendAdapter>> {
        &self.adapter
    }

    /// Path of the GGUF file it was loaded from.
    pub fn path(&self) -> &PathBuf {
        &self.path
    }

    /// Whether a context has this adapter set now.
    pub fn in_use(&self) -> bool {
        self.leases.load(Ordering::Acquire) > 0
    }
}

/// A context's hold on an adapter it has set; releases it when dropped.
pub struct AdapterLease(Arc<LoraAdapter>);

impl AdapterLease {
    /// Counts a lease; take it before using the adapter (see `close`).
    pub fn new(adapter: Arc<LoraAdapter>) -> Self {
        adapter.leases.fetch_add(1, Ordering::AcqRel);
        Self(adapter)
    }

    pub fn adapter(&self) -> &LoraAdapter {
        &self.0
    }

    pub fn is(&self, adapter: &Arc<LoraAdapter>) -> bool {
        Arc::ptr_eq(&self.0, adapter)
    }
}

impl Drop for AdapterLease {
    fn drop(&mut self) {
        self.0.leases.fetch_sub(1, Ordering::AcqRel);
    }
}
