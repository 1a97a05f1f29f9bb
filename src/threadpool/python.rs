//! `ThreadPool`: the Python handle of a `ThreadPool`.

use std::sync::Arc;

use pyo3::prelude::*;

use super::{PoolSettings, ThreadPool};
use crate::closing::closed_by_with;
use crate::errors::python::to_py;
use crate::errors::Error;
use crate::gil::{close_unless_in_use, detached};

/// A pool of `n_threads` ggml compute threads, for `LlamaContext.attach_threadpool`.
///
/// Contexts without one share a pool per thread count; a pool of your own gives a context
/// its own threads or other settings (priority, polling, CPU pinning). It can be attached to
/// one context at a time (ggml pools are not reentrant); the context keeps it alive while
/// attached, and `close()` refuses while it is. A pool started before `os.fork()` has no
/// threads in the child: the child refuses to use it (`ValueError`).
#[pyclass(frozen, module = "llamactx", name = "ThreadPool")]
pub struct PyThreadPool(pub Arc<ThreadPool>);

closed_by_with!(PyThreadPool);

#[pymethods]
impl PyThreadPool {
    /// Starts `n_threads` compute threads (1..=512). `prio` is ggml's scheduling priority
    /// (-1 low .. 3 realtime), `poll` how long idle workers spin (0..=100), `strict_cpu` pins
    /// them to CPUs, `paused` starts them paused.
    #[new]
    #[pyo3(signature = (n_threads, *, prio=0, poll=50, strict_cpu=false, paused=false))]
    fn new(py: Python<'_>, n_threads: i32, prio: i32, poll: u32, strict_cpu: bool, paused: bool) -> PyResult<Self> {
        if !(-1..=3).contains(&prio) || poll > 100 {
            return Err(to_py(Error::value("prio must be in -1..=3 and poll in 0..=100")));
        }
        let settings = PoolSettings {
            prio,
            poll,
            strict_cpu,
            paused,
        };
        let pool = detached(py, || ThreadPool::new(n_threads, &settings))?;
        Ok(Self(Arc::new(pool)))
    }

    /// Number of threads in the pool.
    #[getter]
    fn n_threads(&self) -> i32 {
        self.0.n_threads()
    }

    /// Whether the pool is attached to a context now.
    #[getter]
    fn attached(&self) -> bool {
        self.0.attached()
    }

    /// Stops the threads now. `ValueError` while attached to a context.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        // `attach` counts under the same lock.
        let refusal = "detach the ThreadPool from its context before closing it";
        close_unless_in_use(py, self.0.slot(), "ThreadPool", || self.attached(), refusal)
    }

    fn __repr__(&self) -> String {
        format!(
            "<ThreadPool n_threads={}{}>",
            self.0.n_threads(),
            if self.attached() { " attached" } else { "" }
        )
    }
}
