//! llama.cpp's log lines on Python's `llamactx` logger, and the backend's devices for Python.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::{backend, pending_log_lines};
use crate::errors::python::to_py;

/// How many GPUs (discrete or integrated) the build's backends found: 0 on a CPU build, where
/// `n_gpu_layers` and `main_gpu` change nothing. RPC servers are not counted.
#[pyfunction]
#[pyo3(name = "_gpu_devices")]
pub fn gpu_devices() -> PyResult<usize> {
    backend().map_err(to_py)?;
    // SAFETY: the backend is initialised, which registers its devices; the count and each
    // device llama.cpp returns for an index below it live as long as the process.
    let devices = (0..unsafe { llama_cpp_sys_4::ggml_backend_dev_count() })
        .map(|index| unsafe { llama_cpp_sys_4::ggml_backend_dev_type(llama_cpp_sys_4::ggml_backend_dev_get(index)) })
        .filter(|kind| {
            [
                llama_cpp_sys_4::GGML_BACKEND_DEVICE_TYPE_GPU,
                llama_cpp_sys_4::GGML_BACKEND_DEVICE_TYPE_IGPU,
            ]
            .contains(kind)
        })
        .count();
    Ok(devices)
}

fn python_level(level: u32) -> u8 {
    match level {
        llama_cpp_sys_4::GGML_LOG_LEVEL_DEBUG => 10,
        llama_cpp_sys_4::GGML_LOG_LEVEL_WARN => 30,
        llama_cpp_sys_4::GGML_LOG_LEVEL_ERROR => 40,
        _ => 20,
    }
}

static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Emits every queued llama.cpp log line on the `llamactx` logger. Cheap when none is queued.
///
/// A failing log handler must not fail the call that logged, so its exceptions are dropped,
/// except `KeyboardInterrupt`/`SystemExit` (a pending Ctrl-C runs its Python handler inside
/// the first log call): those are returned for the caller to raise.
pub fn flush_logs(py: Python<'_>) -> Option<PyErr> {
    let lines = pending_log_lines()?;
    let logger = LOGGER
        .get_or_try_init(py, || {
            py.import("logging")?
                .call_method1("getLogger", ("llamactx",))
                .map(Bound::unbind)
        })
        .ok()?;
    let mut interrupt = None;
    for (level, line) in lines {
        if let Err(err) = logger.bind(py).call_method1("log", (python_level(level), line)) {
            if !err.is_instance_of::<PyException>(py) && interrupt.is_none() {
                interrupt = Some(err);
            }
        }
    }
    interrupt
}
