//! `LlamaLoraAdapter`: a LoRA adapter loaded for one model.
//!
//! llama.cpp frees an adapter with its model, and `llama_adapter_lora_free` reaches into the
//! model, so an adapter must be freed before its model: the adapter holds an `Arc` of the
//! model, declared after the adapter so that it drops last. Contexts that set the adapter
//! hold a lease on it, and `close()` refuses while any lease exists.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use llama_cpp_4::model::{LlamaLoraAdapter, LlamaModel};
use pyo3::prelude::*;

use crate::errors::{Error, Result};
use crate::gil::close_unless_in_use;

pub struct SendAdapter(pub LlamaLoraAdapter);

// SAFETY: `LlamaLoraAdapter` is `!Send` only for its raw pointer. An adapter is read-only
// weights after loading; every mutable use goes through the `Mutex` that holds it.
unsafe impl Send for SendAdapter {}

/// A LoRA adapter for one model; set it on a context with `LlamaContext.lora_adapter_set`.
#[pyclass(frozen, module = "llamactx", name = "LlamaLoraAdapter")]
pub struct PyLlamaLoraAdapter {
    adapter: Mutex<Option<SendAdapter>>,
    /// Dropped after `adapter` (field order): the adapter must not outlive its model.
    model: Arc<LlamaModel>,
    leases: AtomicUsize,
    path: PathBuf,
}

impl PyLlamaLoraAdapter {
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
}

/// A context's hold on an adapter it has set; releases it when dropped.
pub struct AdapterLease(Py<PyLlamaLoraAdapter>);

impl AdapterLease {
    /// Counts a lease; take it before using the adapter (see `close`).
    pub fn new(adapter: Py<PyLlamaLoraAdapter>) -> Self {
        adapter.get().leases.fetch_add(1, Ordering::AcqRel);
        Self(adapter)
    }

    pub fn adapter(&self) -> &PyLlamaLoraAdapter {
        self.0.get()
    }

    pub fn is(&self, adapter: &Py<PyLlamaLoraAdapter>) -> bool {
        self.0.is(adapter)
    }
}

impl Drop for AdapterLease {
    fn drop(&mut self) {
        self.0.get().leases.fetch_sub(1, Ordering::AcqRel);
    }
}

#[pymethods]
impl PyLlamaLoraAdapter {
    /// Path of the GGUF file it was loaded from.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Whether a context has this adapter set now.
    #[getter]
    fn in_use(&self) -> bool {
        self.leases.load(Ordering::Acquire) > 0
    }

    /// Frees the adapter now. `ValueError` while a context has it set.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        // A context counts its lease before it locks and uses the adapter.
        let refusal = "remove the adapter from every context before closing it";
        close_unless_in_use(py, &self.adapter, "LlamaLoraAdapter", || self.in_use(), refusal)
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.adapter.try_lock().is_ok_and(|guard| guard.is_none())
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() {
            " (closed)"
        } else if self.in_use() {
            " (in use)"
        } else {
            ""
        };
        format!("<LlamaLoraAdapter{state}>")
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: &Bound<'_, PyAny>,
        _exc: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.close(py)
    }
}
