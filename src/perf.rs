//! `PerfContextData`: llama.cpp's performance counters of a context.

use llama_cpp_4::context::perf::PerfContextData;
use pyo3::prelude::*;

/// Timings (milliseconds) and token counts of a context, read-only. The counters stay at
/// zero unless the context was made with `no_perf=False`.
#[pyclass(frozen, module = "llamactx", name = "PerfContextData")]
pub struct PyPerfContextData {
    /// When the context started, in ms since an arbitrary epoch.
    #[pyo3(get)]
    t_start_ms: f64,
    /// Time spent loading, in ms.
    #[pyo3(get)]
    t_load_ms: f64,
    /// Time spent on prompt (batch) evaluation, in ms.
    #[pyo3(get)]
    t_p_eval_ms: f64,
    /// Time spent on single-token evaluation, in ms.
    #[pyo3(get)]
    t_eval_ms: f64,
    /// Prompt tokens evaluated.
    #[pyo3(get)]
    n_p_eval: i32,
    /// Single tokens evaluated.
    #[pyo3(get)]
    n_eval: i32,
    /// Decodes that reused the previous compute graph instead of building one.
    #[pyo3(get)]
    n_reused: i32,
}

impl From<PerfContextData> for PyPerfContextData {
    fn from(data: PerfContextData) -> Self {
        Self {
            t_start_ms: data.t_start_ms(),
            t_load_ms: data.t_load_ms(),
            t_p_eval_ms: data.t_p_eval_ms(),
            t_eval_ms: data.t_eval_ms(),
            n_p_eval: data.n_p_eval(),
            n_eval: data.n_eval(),
            n_reused: data.n_reused(),
        }
    }
}

#[pymethods]
impl PyPerfContextData {
    fn __repr__(&self) -> String {
        format!(
            "PerfContextData(t_p_eval_ms={:.3}, t_eval_ms={:.3}, n_p_eval={}, n_eval={})",
            self.t_p_eval_ms, self.t_eval_ms, self.n_p_eval, self.n_eval
        )
    }
}
