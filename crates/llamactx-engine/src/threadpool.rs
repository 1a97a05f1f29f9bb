//! `ThreadPool`: a ggml compute thread pool that contexts can share between decodes.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use llama_cpp_sys_4::ggml_threadpool;

use crate::errors::{Error, Result};

/// ggml's limit (`GGML_MAX_N_THREADS`) [llama.cpp internal].
const MAX_THREADS: i32 = 512;

/// The CPUs this process may use (its affinity and CPU quota), at most ggml's limit.
pub fn available_cpus() -> i32 {
    let available = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    i32::try_from(available).unwrap_or(MAX_THREADS).min(MAX_THREADS)
}

/// `value` if it is a thread count from 1 to the CPUs this process may use, else `ValueError`
/// naming `name`. ggml's workers spin while they wait for each other, so more threads than
/// CPUs is not just wasteful: decoding became over 100 times slower (4 threads on 2 CPUs).
pub fn check_threads(name: &str, value: i32) -> Result<i32> {
    let cpus = available_cpus();
    if (1..=cpus).contains(&value) {
        Ok(value)
    } else {
        Err(Error::value(format!(
            "{name} must be in 1..={cpus} (the CPUs this process may use; ggml's threads spin, \
             so more threads than CPUs run many times slower), got {value}"
        )))
    }
}

/// ggml's pool settings that `ThreadPool(...)` exposes.
pub struct PoolSettings {
    pub prio: i32,
    pub poll: u32,
    pub strict_cpu: bool,
    pub paused: bool,
}

impl PoolSettings {
    /// The shared pools: ggml's defaults, as llama.cpp's tools use (workers poll for new work
    /// for about 0.17 s before sleeping). On 2 cores sleeping at once (`poll` 0) measured as
    /// fast (`benches/pools.py`); polling is kept because every decode would otherwise wake
    /// each worker, a cost that grows with the thread count.
    pub const SHARED: Self = Self {
        prio: 0,
        poll: 50,
        strict_cpu: false,
        paused: false,
    };
}

/// Owns one `ggml_threadpool` and knows the process its worker threads live in.
pub struct RawPool {
    pool: NonNull<ggml_threadpool>,
    /// A forked child inherits the pool's memory but none of its threads.
    pid: u32,
}

// SAFETY: a ggml thread pool is a heap object with its own worker threads; the handle may be
// used from any thread. Concurrent use is prevented by allowing one attachment at a time
// (`ThreadPool::attach`) and by the context lock of that one context, or, for the shared
// pools, by the mutex each is held under while it computes.
unsafe impl Send for RawPool {}

impl RawPool {
    /// Starts `n_threads` (1..=the CPUs this process may use) compute threads.
    pub fn new(n_threads: i32, settings: &PoolSettings) -> Result<Self> {
        check_threads("n_threads", n_threads)?;
        crate::backend::backend()?;
        // SAFETY: plain value calls; the params struct lives on this stack for the call.
        let raw = unsafe {
            let mut params = llama_cpp_sys_4::ggml_threadpool_params_default(n_threads);
            params.prio = settings.prio;
            params.poll = settings.poll;
            params.strict_cpu = settings.strict_cpu;
            params.paused = settings.paused;
            llama_cpp_sys_4::ggml_threadpool_new(&raw mut params)
        };
        let pool =
            NonNull::new(raw).ok_or_else(|| Error::state("ThreadPoolNew", "ggml could not create the thread pool"))?;
        Ok(Self {
            pool,
            pid: std::process::id(),
        })
    }

    pub fn as_ptr(&self) -> *mut ggml_threadpool {
        self.pool.as_ptr()
    }

    /// Whether its threads exist: false in a process forked after the pool started, where a
    /// computation handed to it would wait for them forever.
    pub fn usable(&self) -> bool {
        self.pid == std::process::id()
    }
}

impl Drop for RawPool {
    fn drop(&mut self) {
        if !self.usable() {
            // Freeing joins the worker threads, which this forked process does not have
            // (ggml asserts, or waits forever): the memory is left to the process's exit.
            return;
        }
        // SAFETY: the pool was made by `ggml_threadpool_new` and is freed once, here; nothing
        // is attached to it any more (see `ThreadPool`'s `close` and `OpenContext`'s field order).
        unsafe { llama_cpp_sys_4::ggml_threadpool_free(self.pool.as_ptr()) };
    }
}

/// A pool of ggml compute threads that a context may have for its own (`ThreadPool` in Python:
/// `python.rs`), attached to one context at a time.
pub struct ThreadPool {
    pool: Mutex<Option<RawPool>>,
    attachments: AtomicUsize,
    n_threads: i32,
}

impl ThreadPool {
    /// A pool of `n_threads` threads started with `settings`.
    pub fn new(n_threads: i32, settings: &PoolSettings) -> Result<Self> {
        Ok(Self {
            pool: Mutex::new(Some(RawPool::new(n_threads, settings)?)),
            attachments: AtomicUsize::new(0),
            n_threads,
        })
    }

    /// Number of threads in the pool.
    pub fn n_threads(&self) -> i32 {
        self.n_threads
    }

    /// Whether the pool is attached to a context now.
    pub fn attached(&self) -> bool {
        self.attachments.load(Ordering::Acquire) > 0
    }

    /// The pool itself (None once closed), for closing it.
    pub fn slot(&self) -> &Mutex<Option<RawPool>> {
        &self.pool
    }

    /// The raw pool for `llama_attach_threadpool`, counting the attachment. The caller must
    /// call `detach` once the context no longer uses it.
    pub fn attach(&self) -> Result<*mut ggml_threadpool> {
        let guard = self.pool.lock().map_err(|_| Error::Poisoned("ThreadPool"))?;
        let pool = guard.as_ref().ok_or_else(|| Error::closed("ThreadPool"))?;
        if !pool.usable() {
            return Err(Error::value(FORKED));
        }
        if self
            .attachments
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(Error::value("this ThreadPool is already attached to a context"));
        }
        Ok(pool.as_ptr())
    }

    pub fn detach(&self) {
        self.attachments.store(0, Ordering::Release);
    }

    /// Whether the pool can run work in this process (see `RawPool::usable`).
    fn usable(&self) -> bool {
        self.pool
            .lock()
            .is_ok_and(|guard| guard.as_ref().is_some_and(RawPool::usable))
    }
}

/// Why a pool from before a fork cannot be used.
pub const FORKED: &str =
    "this ThreadPool was started in the parent of this forked process, where its threads stay; make a new one here";

/// A context's hold on an attached pool; detaches the count when dropped (after the context
/// that used the pool is freed, see `OpenContext`'s field order).
pub struct PoolLease(Arc<ThreadPool>);

impl PoolLease {
    /// Counts the attachment and returns the raw pool with the lease.
    pub fn attach(pool: Arc<ThreadPool>) -> Result<(Self, *mut ggml_threadpool)> {
        let raw = pool.attach()?;
        Ok((Self(pool), raw))
    }

    pub fn usable(&self) -> bool {
        self.0.usable()
    }
}

impl Drop for PoolLease {
    fn drop(&mut self) {
        self.0.detach();
    }
}
