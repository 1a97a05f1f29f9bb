//! `LlamaLoraAdapter`: the Python handle of a `LoraAdapter`.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;

use super::LoraAdapter;
use crate::closing::closed_by_with;
use crate::gil::close_unless_in_use;

/// A LoRA adapter for one model; set it on a context with `LlamaContext.lora_adapter_set`.
#[pyclass(frozen, module = "llamactx", name = "LlamaLoraAdapter")]
pub struct PyLlamaLoraAdapter(pub Arc<LoraAdapter>);

closed_by_with!(PyLlamaLoraAdapter);

#[pymethods]
impl PyLlamaLoraAdapter {
    /// Path of the GGUF file it was loaded from.
    #[getter]
    fn path(&self) -> PathBuf {
        self.0.path().clone()
    }

    /// Whether a context has this adapter set now.
    #[getter]
    fn in_use(&self) -> bool {
        self.0.in_use()
    }

    /// Frees the adapter now. `ValueError` while a context has it set.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        // A context counts its lease before it locks and uses the adapter.
        let refusal = "remove the adapter from every context before closing it";
        close_unless_in_use(py, self.0.slot(), "LlamaLoraAdapter", || self.in_use(), refusal)
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.0.slot().try_lock().is_ok_and(|guard| guard.is_none())
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
}
