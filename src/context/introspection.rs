//! What the context reports about itself: performance counters, memory use and raw pointers.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::PyLlamaContext;
use crate::perf::PyPerfContextData;

#[pymethods]
impl PyLlamaContext {
    /// Performance counters since the context started or since `perf_context_reset`.
    fn timings(&self, py: Python<'_>) -> PyResult<PyPerfContextData> {
        self.run(py, |native| Ok(native.with_mut(|context| context.timings()).into()))
    }

    /// Resets ggml's clock (the crate's `reset_timings`).
    fn reset_timings(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |native| {
            native.with_mut(|context| context.reset_timings());
            Ok(())
        })
    }

    /// Zeroes the performance counters.
    fn perf_context_reset(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |native| {
            native.with_mut(|context| context.perf_context_reset());
            Ok(())
        })
    }

    /// Logs the memory each buffer type uses (to the `llamactx` logger).
    fn memory_breakdown_print(&self, py: Python<'_>) -> PyResult<()> {
        self.read(py, |context| context.memory_breakdown_print())
    }

    /// Memory per buffer type: a list of dicts with `buft_name`, `model`, `context`,
    /// `compute` and `total` (bytes).
    fn memory_breakdown<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let entries = self.read(py, |context| context.memory_breakdown())?;
        entries
            .into_iter()
            .map(|entry| {
                let record = PyDict::new(py);
                record.set_item("buft_name", &entry.buft_name)?;
                record.set_item("model", entry.model)?;
                record.set_item("context", entry.context)?;
                record.set_item("compute", entry.compute)?;
                record.set_item("total", entry.total())?;
                Ok(record)
            })
            .collect()
    }

    /// Address of the native `llama_model`, for FFI interop only.
    fn get_model_ptr(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |context| context.get_model_ptr() as usize)
    }

    /// Address of the native `llama_context`, for FFI interop only: valid until `close()`.
    fn as_ptr(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |context| context.as_ptr() as usize)
    }
}
