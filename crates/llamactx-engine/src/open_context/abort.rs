//! The abort callback: Ctrl-C, and the caller's own check (a Python callable, in
//! `context/abort.rs`), polled while llama.cpp computes a graph.
//!
//! llama.cpp calls the C function below after each graph node, on the thread that called
//! decode (which has released the GIL). It is registered for the whole life of the context:
//! checking for Ctrl-C is one atomic load. Calling Python that often would slow decoding down,
//! so the caller's check runs at most once per `POLL_INTERVAL`, and always at the first node.

use std::any::Any;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::errors::Error;
use crate::interrupt;

/// A check llama.cpp makes while it computes: `Ok(true)` stops the computation, and an error
/// stops it too and is what the aborted call fails with.
pub trait AbortCheck: Send + Sync {
    fn should_abort(&self) -> Result<bool, Error>;
    /// The check itself, for a caller that needs to see what it holds.
    fn as_any(&self) -> &dyn Any;
}

pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// What the C callback reads. Boxed by `OpenContext`, so its address stays fixed while llama.cpp
/// holds it.
#[derive(Default)]
pub struct AbortFlags {
    callback: Mutex<Option<Arc<dyn AbortCheck>>>,
    /// Whether `callback` holds one, readable without the lock on every graph node.
    has_callback: AtomicBool,
    last_poll: Mutex<Option<Instant>>,
    /// Set when the callback asked to abort (or raised) during the current computation.
    fired: AtomicBool,
    /// Whether the current computation watches Ctrl-C (it runs on the main thread).
    watches_sigint: AtomicBool,
    /// The error the callback failed with, the aborted decode's error.
    raised: Mutex<Option<Error>>,
}

impl AbortFlags {
    /// Sets (or, with None, removes) the check polled while llama.cpp computes.
    pub fn set_callback(&self, callback: Option<Arc<dyn AbortCheck>>) -> Result<(), Error> {
        let mut slot = self.callback.lock().map_err(|_| Error::Poisoned("abort callback"))?;
        self.has_callback.store(callback.is_some(), Ordering::Release);
        *slot = callback;
        Ok(())
    }

    /// Shows `visit` the check set now (for Python's cyclic garbage collector: a bound method of
    /// an object that holds the context makes a cycle). Skipped while a decode polls it.
    pub fn visit_callback<E>(&self, visit: impl FnOnce(&dyn AbortCheck) -> Result<(), E>) -> Result<(), E> {
        if let Ok(slot) = self.callback.try_lock() {
            if let Some(callback) = slot.as_ref() {
                visit(callback.as_ref())?;
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
    /// error) when the callback caused it.
    pub fn explain(&self, error: Error) -> Error {
        if !self.fired.load(Ordering::Acquire) {
            return error;
        }
        // A Ctrl-C that lands while the Python callback runs is raised inside it: the
        // callback's exception is then the `KeyboardInterrupt` to re-raise.
        match self.raised.lock().ok().and_then(|mut raised| raised.take()) {
            Some(failure) => failure,
            None => Error::Aborted {
                interrupted: self.sigint(),
            },
        }
    }

    pub fn sigint(&self) -> bool {
        self.watches_sigint.load(Ordering::Acquire) && interrupt::interrupted()
    }

    pub fn due(&self) -> bool {
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
    pub fn poll(&self) -> bool {
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
        // Cloned out of the lock: the check may set another one.
        let callback = self.callback.lock().ok().and_then(|slot| slot.clone());
        let Some(callback) = callback else { return false };
        let abort = match callback.should_abort() {
            Ok(abort) => abort,
            Err(failure) => {
                if let Ok(mut raised) = self.raised.lock() {
                    *raised = Some(failure);
                }
                true
            }
        };
        if abort {
            self.fired.store(true, Ordering::Release);
        }
        abort
    }
}

/// The `ggml_abort_callback` given to llama.cpp; `data` is a `*const AbortFlags`.
///
/// # Safety
///
/// `data` is null or points to a live `AbortFlags` (the context's, registered by `OpenContext`).
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
