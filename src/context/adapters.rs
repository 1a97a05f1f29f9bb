//! `LlamaContext`'s methods for LoRA adapters and control vectors (`open_context/adapters.rs`).

use std::sync::Arc;

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;

use super::PyLlamaContext;
use crate::errors::{Error, ExcClass};
use crate::lora::python::PyLlamaLoraAdapter;

/// A control vector as one flat float32 buffer (any array-like: 2-D `(n_layer - 1, n_embd)`
/// arrays are flattened), or `None` for "clear".
fn control_vector(data: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<f32>>> {
    let Some(data) = data else { return Ok(None) };
    let numpy = data.py().import("numpy")?;
    let flat = numpy
        .call_method1("ascontiguousarray", (data, "float32"))?
        .call_method0("ravel")?;
    let flat: PyReadonlyArray1<'_, f32> = flat.extract()?;
    let values = flat.as_slice()?.to_vec();
    Ok((!values.is_empty()).then_some(values))
}

#[pymethods]
impl PyLlamaContext {
    /// Applies `adapter` with weight `scale` (0 leaves the model unchanged). Replaces any
    /// adapter set before, as the crate does; the context keeps the adapter alive while set.
    /// `ValueError` for an adapter of another model; `LlamaLoraAdapterSetError` on failure.
    fn lora_adapter_set(&self, py: Python<'_>, adapter: Py<PyLlamaLoraAdapter>, scale: f32) -> PyResult<()> {
        self.run(py, |native| native.set_lora(Arc::clone(&adapter.get().0), scale))
    }

    /// Removes the adapter set on this context (the crate clears every adapter).
    /// `ValueError` when `adapter` is not the one set.
    fn lora_adapter_remove(&self, py: Python<'_>, adapter: Py<PyLlamaLoraAdapter>) -> PyResult<()> {
        self.run(py, |native| {
            let adapter = &adapter.get().0;
            if !native.lora.as_ref().is_some_and(|lease| lease.is(adapter)) {
                return Err(Error::value("this adapter is not set on this context"));
            }
            let mut guard = adapter.lock()?;
            let raw = guard.as_mut().ok_or_else(|| Error::closed("LlamaLoraAdapter"))?;
            native.with_mut(|context| context.lora_adapter_remove(&mut raw.0))?;
            native.lora = None;
            Ok(())
        })
    }

    /// Adds control vector `data` (per layer 1.., `n_embd` floats each; a 2-D array is
    /// flattened) to the layers `il_start..=il_end`. Empty or `None` data clears it.
    /// `ValueError` when `n_embd` is not the model's.
    #[pyo3(signature = (data, n_embd, il_start, il_end))]
    fn set_adapter_cvec(
        &self,
        py: Python<'_>,
        data: Option<&Bound<'_, PyAny>>,
        n_embd: i32,
        il_start: i32,
        il_end: i32,
    ) -> PyResult<()> {
        let values = control_vector(data)?;
        self.run(py, |native| {
            let model_embd = native.model().n_embd();
            if values.is_some() && n_embd != model_embd {
                return Err(Error::value(format!("n_embd is {n_embd}, the model's is {model_embd}")));
            }
            let code = native.with_mut(|context| {
                if let Some(values) = &values {
                    return context.set_adapter_cvec(values, n_embd, il_start, il_end).err();
                }
                // SAFETY: a null buffer tells llama.cpp to switch the control vector off; the
                // context pointer is the live one of this cell.
                let code = unsafe {
                    llama_cpp_sys_4::llama_set_adapter_cvec(
                        context.as_ptr(),
                        std::ptr::null(),
                        0,
                        n_embd,
                        il_start,
                        il_end,
                    )
                };
                (code != 0).then_some(code)
            });
            match code {
                None => Ok(()),
                Some(code) => Err(Error::llama(
                    ExcClass::StateError,
                    "SetAdapterCvec",
                    Some(i64::from(code)),
                    "llama.cpp refused the control vector",
                )),
            }
        })
    }
}
