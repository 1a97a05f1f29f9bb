//! A bound on the work of llama.cpp's Jinja engine (`work_limit.cpp`), which has no limit of its
//! own: `{% for i in range(10000000) %}` rendered for minutes, uninterruptibly, while a template
//! was analysed and again for every chat.
//!
//! The engine allocates for every value, scope and piece of text it makes, so a limit on the
//! allocations (and their bytes) of one call bounds its time and memory. Measured: parsing and
//! analysing a template makes about 25,000 allocations, rendering twenty 12 KB messages with
//! twenty tools about 110,000 (12 MB); a loop stopped at the limit took under a second here.
//! Ctrl-C on Python's main thread stops it too.

use std::ffi::c_int;

use pyo3::prelude::*;

use crate::errors::{Error, ExcClass, Result};
use crate::interrupt::{self, SigintWatch};

/// The most C++ allocations one template call (a parse with its analysis, or one render) may
/// make.
pub const MAX_ALLOCATIONS: u64 = 5_000_000;
/// The most bytes they may ask for in all.
pub const MAX_BYTES: u64 = 1 << 30;

extern "C" {
    fn llamactx_work_limit_begin(allocations: u64, bytes: u64, interrupted: Option<extern "C" fn() -> bool>);
    fn llamactx_work_limit_end() -> c_int;
}

extern "C" fn interrupted() -> bool {
    interrupt::interrupted()
}

/// Runs `work` (calls into llama.cpp's Jinja engine, on this thread) within the limit. When the
/// limit stopped it, the error is `ChatTemplateError` kind `WorkLimit`, or the
/// `KeyboardInterrupt` of a Ctrl-C, whatever `work` reported.
pub fn limited<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    let watch = SigintWatch::start();
    let poll = watch.as_ref().map(|_| interrupted as extern "C" fn() -> bool);
    // SAFETY: begin and end only set this thread's counters; they bracket `work` on this thread.
    unsafe { llamactx_work_limit_begin(MAX_ALLOCATIONS, MAX_BYTES, poll) };
    let outcome = work();
    // SAFETY: as above.
    let stopped = unsafe { llamactx_work_limit_end() };
    drop(watch);
    match stopped {
        0 => outcome,
        2 => Err(Python::attach(|py| py.check_signals()).err().map_or_else(
            || stopped_error("the chat template was interrupted".to_owned()),
            Error::Python,
        )),
        _ => Err(stopped_error(format!(
            "the chat template did more work than one call may ({MAX_ALLOCATIONS} allocations, {} GiB): \
             a template that loops this long is refused",
            MAX_BYTES >> 30
        ))),
    }
}

fn stopped_error(message: String) -> Error {
    Error::llama(ExcClass::ChatTemplateError, "WorkLimit", None, message)
}
