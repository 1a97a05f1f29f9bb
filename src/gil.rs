//! Running native work: without the GIL, with panics caught, logs flushed afterwards.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use pyo3::prelude::*;

use crate::backend::python::flush_logs;
use crate::errors::python::to_py;
use crate::errors::{Error, Result};

/// Runs `work` with the GIL released, so other Python threads run meanwhile and llama.cpp's
/// callbacks (abort, log) can take it. A panic inside becomes an exception instead of
/// unwinding into Python as `PanicException`.
pub fn detached<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    F: FnOnce() -> Result<T> + Send,
    T: Send,
{
    let result = py.detach(|| catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|p| Err(panic_error(&p))));
    if let Some(interrupt) = flush_logs(py) {
        return Err(interrupt);
    }
    result.map_err(to_py)
}

/// Frees what `slot` holds (without the GIL) unless `in_use()` says a context still uses it.
/// `in_use` is checked with the slot locked; users count themselves before they lock it, so
/// the check cannot race with one starting to use the value.
pub fn close_unless_in_use<T: Send>(
    py: Python<'_>,
    slot: &Mutex<Option<T>>,
    name: &'static str,
    in_use: impl Fn() -> bool + Send + Sync,
    refusal: &'static str,
) -> PyResult<()> {
    let value = detached(py, || {
        let mut guard = slot.lock().map_err(|_| Error::Poisoned(name))?;
        if in_use() {
            return Err(Error::value(refusal));
        }
        Ok(guard.take())
    })?;
    py.detach(|| drop(value));
    Ok(())
}

fn panic_error(payload: &(dyn std::any::Any + Send)) -> Error {
    let message = payload
        .downcast_ref::<&str>()
        .map(ToString::to_string)
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    Error::Panic(message)
}
