//! The abort callback: Ctrl-C, and a Python callable, polled while llama.cpp computes a graph.
//!
//! llama.cpp calls the C function below after each graph node, on the thread that called
//! decode (which has released the GIL). It is registered for the whole life of the context:
//! checking for Ctrl-C is one atomic load. Calling Python that often would slow decoding down,
//! so a Python callable runs at most once per `POLL_INTERVAL`, and always at the first node.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::errors::Error;
use crate::interrupt;

const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// What the C callback reads. Boxed by `OpenContext`, so its address stays fixed while llama.cpp
/// holds it.
#[derive(Default)]
pub struct AbortFlags {
    callback: Mutex<Option<Py<PyAny>>>,
    /// Whether `callback` holds one, readable without the lock on every graph node.
    has_callback: AtomicBool,
    last_poll: Mutex<Option<Instant>>,
    /// Set when the callback asked to abort (or raised) during the current computation.
    fired: AtomicBool,
    /// Whether the current computation watches Ctrl-C (it runs on the main thread).
    watches_sigint: AtomicBool,
    /// The exception the callback raised, re-raised after the aborted decode.
    raised: Mutex<Option<PyErr>>,
}

impl AbortFlags {
    pub fn set_callback(&self, callback: Option<Py<PyAny>>) -> Result<(), Error> {
        let mut slot = self.callback.lock().map_err(|_| Error::Poisoned("abort callback"))?;
        self.has_callback.store(callback.is_some(), Ordering::Release);
        *slot = callback;
        Ok(())
    }

    /// Shows the callback to Python's cyclic garbage collector (a bound method of an object
    /// that holds the context makes a cycle). Skipped while a decode polls it.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(slot) = self.callback.try_lock() {
            if let Some(callback) = slot.as_ref() {
                visit.call(callback)?;
            }
        }
        Ok(())
    }

    /// Drops the callback for the garbage collector, unless a decode is polling it.
    pub fn clear(&self) {
        if let Ok(mut slot) = self.callback.try_lock() {
            self.has_callback.store(false, Ordering::Release);
            slot.take();
        }
    }

    /// Resets the per-computation state before a decode or encode; `watches_sigint` when the
    /// computation holds a `SigintWatch`.
    pub fn arm(&self, watches_sigint: bool) {
        self.fired.store(false, Ordering::Release);
        self.watches_sigint.store(watches_sigint, Ordering::Release);
        if let Ok(mut last) = self.last_poll.lock() {
            *last = None;
        }
    }

    /// Turns the error of a failed computation into `DecodeAborted` (or the callback's own
    /// exception) when the callback caused it.
    pub fn explain(&self, error: Error) -> Error {
        if !self.fired.load(Ordering::Acquire) {
            return error;
        }
        // A Ctrl-C that lands while the Python callback runs is raised inside it: the
        // callback's exception is then the `KeyboardInterrupt` to re-raise.
        match self.raised.lock().ok().and_then(|mut raised| raised.take()) {
            Some(exception) => Error::from(exception),
            None => Error::Aborted {
                interrupted: self.sigint(),
            },
        }
    }

    fn sigint(&self) -> bool {
        self.watches_sigint.load(Ordering::Acquire) && interrupt::interrupted()
    }

    fn due(&self) -> bool {
        let Ok(mut last) = self.last_poll.lock() else {
            return false;
        };
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < POLL_INTERVAL) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// Whether the current computation should stop: Ctrl-C, or the callback asked to.
    pub(super) fn poll(&self) -> bool {
        if self.fired.load(Ordering::Acquire) {
            return true;
        }
        if self.sigint() {
            self.fired.store(true, Ordering::Release);
            return true;
        }
        if !self.has_callback.load(Ordering::Acquire) || !self.due() {
            return false;
        }
        let abort = Python::attach(|py| {
            let callback = self
                .callback
                .lock()
                .ok()
                .and_then(|slot| slot.as_ref().map(|c| c.clone_ref(py)));
            let Some(callback) = callback else { return false };
            match callback.call0(py).and_then(|answer| answer.is_truthy(py)) {
                Ok(abort) => abort,
                Err(exception) => {
                    if let Ok(mut raised) = self.raised.lock() {
                        *raised = Some(exception);
                    }
                    true
                }
            }
        });
        if abort {
            self.fired.store(true, Ordering::Release);
        }
        abort
    }
}

/// The `ggml_abort_callback` given to llama.cpp; `data` is a `*const AbortFlags`.
pub unsafe extern "C" fn poll_abort(data: *mut c_void) -> bool {
    if data.is_null() {
        return false;
    }
    // SAFETY: `data` is the address of the `AbortFlags` box owned by the context's `OpenContext`,
    // which outlives the llama.cpp context it is registered with (see `OpenContext`'s field order).
    let flags = unsafe { &*data.cast::<AbortFlags>() };
    // A panic must not unwind into llama.cpp; treat it as "do not abort".
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| flags.poll())).unwrap_or(false)
}
