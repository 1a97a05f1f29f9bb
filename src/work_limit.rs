//! A bound on the work of llama.cpp's Jinja engine (`work_limit.cpp`), which has no limit of its
//! own: `{% for i in range(10000000) %}` rendered for minutes, uninterruptibly, while a template
//! was analysed and again for every chat.
//!
//! The engine allocates for every value, scope and piece of text it makes, so a limit on the
//! allocations (and their bytes) of one call bounds its time and memory. Measured: parsing and
//! analysing a template makes about 25,000 allocations, rendering twenty 12 KB messages with
//! twenty tools about 110,000 (12 MB), and SmolLM2's template about 27 per byte of a long chat's
//! messages (2,000 allocations a message of 74 bytes as JSON); a loop stopped at the base limit
//! took under a second here. The limit grows with the input, so that every chat that fits a
//! context renders (3,000 messages were refused as a loop with a fixed limit). Ctrl-C on
//! Python's main thread stops it too.

use std::ffi::c_int;

use pyo3::prelude::*;

use crate::errors::{Error, ExcClass, Result};
use crate::interrupt::{self, SigintWatch};

/// The most C++ allocations one template call (a parse with its analysis, or one render) may
/// make, whatever its input.
pub const MAX_ALLOCATIONS: u64 = 5_000_000;
/// The most bytes they may ask for in all, whatever the input.
pub const MAX_BYTES: u64 = 1 << 30;
/// What each byte of input (the template's text, or a render's messages and tools as JSON) adds
/// to the allocations: about four times what a chat of short messages takes.
pub const ALLOCATIONS_PER_INPUT_BYTE: u64 = 100;
/// What each byte of input adds to the bytes allocated: a template that concatenates its output
/// copies it once a message.
pub const BYTES_PER_INPUT_BYTE: u64 = 16 << 10;

/// The allocations and bytes a call with `input_bytes` of input may spend.
fn budget(input_bytes: usize) -> (u64, u64) {
    let input = u64::try_from(input_bytes).unwrap_or(u64::MAX);
    (
        MAX_ALLOCATIONS.saturating_add(input.saturating_mul(ALLOCATIONS_PER_INPUT_BYTE)),
        MAX_BYTES.saturating_add(input.saturating_mul(BYTES_PER_INPUT_BYTE)),
    )
}

extern "C" {
    fn llamactx_work_limit_begin(allocations: u64, bytes: u64, interrupted: Option<extern "C" fn() -> bool>);
    fn llamactx_work_limit_end() -> c_int;
}

extern "C" fn interrupted() -> bool {
    interrupt::interrupted()
}

/// Runs `work` (calls into llama.cpp's Jinja engine, on this thread, given `input_bytes` of
/// input) within the limit. When the limit stopped it, the error is `ChatTemplateError` kind
/// `WorkLimit`, or the `KeyboardInterrupt` of a Ctrl-C, whatever `work` reported.
pub fn limited<T>(input_bytes: usize, work: impl FnOnce() -> Result<T>) -> Result<T> {
    let (allocations, bytes) = budget(input_bytes);
    let watch = SigintWatch::start();
    let poll = watch.as_ref().map(|_| interrupted as extern "C" fn() -> bool);
    // SAFETY: begin and end only set this thread's counters; they bracket `work` on this thread.
    unsafe { llamactx_work_limit_begin(allocations, bytes, poll) };
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
            "the chat template did more work than one call with {input_bytes} bytes of input may \
             ({allocations} allocations, {} MiB): a template that loops this long is refused",
            bytes >> 20
        ))),
    }
}

fn stopped_error(message: String) -> Error {
    Error::llama(ExcClass::ChatTemplateError, "WorkLimit", None, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_grows_with_the_input_and_saturates() {
        assert_eq!(budget(0), (MAX_ALLOCATIONS, MAX_BYTES));
        let (allocations, bytes) = budget(200_000);
        assert_eq!(allocations, MAX_ALLOCATIONS + 200_000 * ALLOCATIONS_PER_INPUT_BYTE);
        assert_eq!(bytes, MAX_BYTES + 200_000 * BYTES_PER_INPUT_BYTE);
        assert_eq!(budget(usize::MAX), (u64::MAX, u64::MAX));
    }
}
