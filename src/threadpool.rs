//! `ThreadPool`: a ggml compute thread pool that contexts can share between decodes.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use llama_cpp_sys_4::ggml_threadpool;
use pyo3::prelude::*;

use crate::errors::{Error, Result};
use crate::native::close_unless_in_use;

/// ggml's limit (`GGML_MAX_N_THREADS`).
const MAX_THREADS: i32 = 512;

/// Owns one `ggml_threadpool`.
pub struct RawPool(NonNull<ggml_threadpool>);

// SAFETY: a ggml thread pool is a heap object with its own worker threads; the handle may be
// used from any thread. Concurrent use is prevented by allowing one attachment at a time
// (`PyThreadPool::attach`) and by the context lock of that one context.
unsafe impl Send for RawPool {}

impl Drop for RawPool {
    fn drop(&mut self) {
        // SAFETY: the pool was made by `ggml_threadpool_new` and is freed once, here; nothing
        // is attached to it any more (see `PyThreadPool::close`).
        unsafe { llama_cpp_sys_4::ggml_threadpool_free(self.0.as_ptr()) };
    }
}

/// A pool of `n_threads` ggml compute threads, for `LlamaContext.attach_threadpool`.
///
/// A pool can be attached to one context at a time (ggml pools are not reentrant); the
/// context keeps it alive while attached, and `close()` refuses while it is.
#[pyclass(frozen, module = "llamactx", name = "ThreadPool")]
pub struct PyThreadPool {
    pool: Mutex<Option<RawPool>>,
    attachments: AtomicUsize,
    n_threads: i32,
}

impl PyThreadPool {
    /// The raw pool for `llama_attach_threadpool`, counting the attachment. The caller must
    /// call `detach` once the context no longer uses it.
    pub fn attach(&self) -> Result<*mut ggml_threadpool> {
        let guard = self.pool.lock().map_err(|_| Error::Poisoned("ThreadPool"))?;
        let pool = guard.as_ref().ok_or_else(|| Error::closed("ThreadPool"))?;
        if self
            .attachments
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(Error::value("this ThreadPool is already attached to a context"));
        }
        Ok(pool.0.as_ptr())
    }

    pub fn detach(&self) {
        self.attachments.store(0, Ordering::Release);
    }
}

#[pymethods]
impl PyThreadPool {
    /// Starts `n_threads` compute threads (1..=512). `prio` is ggml's scheduling priority
    /// (-1 low .. 3 realtime), `poll` how long idle workers spin (0..=100), `strict_cpu` pins
    /// them to CPUs, `paused` starts them paused.
    #[new]
    #[pyo3(signature = (n_threads, *, prio=0, poll=50, strict_cpu=false, paused=false))]
    fn new(py: Python<'_>, n_threads: i32, prio: i32, poll: u32, strict_cpu: bool, paused: bool) -> PyResult<Self> {
        if !(1..=MAX_THREADS).contains(&n_threads) {
            return Err(Error::value(format!("n_threads must be in 1..={MAX_THREADS}, got {n_threads}")).into());
        }
        if !(-1..=3).contains(&prio) || poll > 100 {
            return Err(Error::value("prio must be in -1..=3 and poll in 0..=100").into());
        }
        crate::backend::backend()?;
        let pool = py.detach(|| {
            // SAFETY: plain value calls; the params struct lives on this stack for the call.
            let raw = unsafe {
                let mut params = llama_cpp_sys_4::ggml_threadpool_params_default(n_threads);
                params.prio = prio;
                params.poll = poll;
                params.strict_cpu = strict_cpu;
                params.paused = paused;
                llama_cpp_sys_4::ggml_threadpool_new(&raw mut params)
            };
            NonNull::new(raw).map(RawPool)
        });
        let pool = pool.ok_or_else(|| Error::state("ThreadPoolNew", "ggml could not create the thread pool"))?;
        Ok(Self {
            pool: Mutex::new(Some(pool)),
            attachments: AtomicUsize::new(0),
            n_threads,
        })
    }

    /// Number of threads in the pool.
    #[getter]
    fn n_threads(&self) -> i32 {
        self.n_threads
    }

    /// Whether the pool is attached to a context now.
    #[getter]
    fn attached(&self) -> bool {
        self.attachments.load(Ordering::Acquire) > 0
    }

    /// Stops the threads now. `ValueError` while attached to a context.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        // `attach` counts under the same lock.
        let refusal = "detach the ThreadPool from its context before closing it";
        close_unless_in_use(py, &self.pool, "ThreadPool", || self.attached(), refusal)
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

    fn __repr__(&self) -> String {
        format!(
            "<ThreadPool n_threads={}{}>",
            self.n_threads,
            if self.attached() { " attached" } else { "" }
        )
    }
}

/// A context's hold on an attached pool; detaches the count when dropped (after the context
/// that used the pool is freed, see `Native`'s field order).
pub struct PoolLease(Py<PyThreadPool>);

impl PoolLease {
    /// Counts the attachment and returns the raw pool with the lease.
    pub fn attach(pool: Py<PyThreadPool>) -> Result<(Self, *mut ggml_threadpool)> {
        let raw = pool.get().attach()?;
        Ok((Self(pool), raw))
    }
}

impl Drop for PoolLease {
    fn drop(&mut self) {
        self.0.get().detach();
    }
}
