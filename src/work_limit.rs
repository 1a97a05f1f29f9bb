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
//! Python's main thread stops it too, and so do a deadline and a bound on the heap's growth,
//! for the work the count cannot see (string work; the C++ runtime's own allocations).
//!
//! Each call runs on a thread of its own, which the caller can leave behind: past the deadline
//! (the thread may be inside one long string operation, which no allocation interrupts), or when
//! the C++ code ends in `std::terminate` (an allocation that throws inside a `noexcept` frame),
//! which strands that thread instead of ending the process. At most `MAX_LEFT_BEHIND` threads
//! are left behind at once; past that, template calls are refused until one ends.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use pyo3::prelude::*;

use crate::errors::python::foreign;
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
/// The time one call may take, whatever its input (a render of 3,000 messages took about half a
/// second here), and what each byte of input adds.
const SECONDS: u64 = 5;
const NANOS_PER_INPUT_BYTE: u64 = 20_000;
/// How much the process's heap may grow during one call, whatever its input, and what each byte
/// of input adds: what the call keeps at once, where `MAX_BYTES` counts all it asks for.
const HEAP_GROWTH: u64 = 256 << 20;
const HEAP_GROWTH_PER_INPUT_BYTE: u64 = 1 << 10;
/// How long past its deadline the caller waits for a call before leaving it behind.
const GRACE: Duration = Duration::from_secs(1);
/// Threads left behind (still running past their deadlines, or stranded by `std::terminate`)
/// that may exist at once.
pub const MAX_LEFT_BEHIND: usize = 2;

static LEFT_BEHIND: AtomicUsize = AtomicUsize::new(0);

/// What a call with `input_bytes` of input may spend: allocations, bytes, nanoseconds and heap
/// growth.
fn budget(input_bytes: usize) -> (u64, u64, u64, u64) {
    let input = u64::try_from(input_bytes).unwrap_or(u64::MAX);
    (
        MAX_ALLOCATIONS.saturating_add(input.saturating_mul(ALLOCATIONS_PER_INPUT_BYTE)),
        MAX_BYTES.saturating_add(input.saturating_mul(BYTES_PER_INPUT_BYTE)),
        (SECONDS * 1_000_000_000).saturating_add(input.saturating_mul(NANOS_PER_INPUT_BYTE)),
        HEAP_GROWTH.saturating_add(input.saturating_mul(HEAP_GROWTH_PER_INPUT_BYTE)),
    )
}

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn llamactx_work_limit_begin(
        allocations: u64,
        bytes: u64,
        nanos: u64,
        heap_growth: u64,
        interrupted: Option<extern "C" fn() -> bool>,
        abandoned: *const bool,
        stranded: Option<extern "C" fn(*mut c_void)>,
        stranded_data: *mut c_void,
    );
    fn llamactx_work_limit_end() -> c_int;
}

extern "C" fn interrupted() -> bool {
    interrupt::interrupted()
}

/// Where a limited call stands, shared by its thread and its caller.
enum Phase<T> {
    Running,
    /// It returned: its outcome, and why the limit stopped it (`llamactx_work_limit_end`).
    Finished(Result<T>, c_int),
    /// `std::terminate` on its thread: the thread sleeps for good.
    Stranded,
    /// The caller stopped waiting; the thread ends when the work does.
    LeftBehind,
}

struct Call<T> {
    phase: Mutex<Phase<T>>,
    changed: Condvar,
    /// Read by the C++ limit: set when the caller leaves the call behind, so that its next
    /// allocation throws.
    abandoned: AtomicBool,
}

/// What the C++ terminate handler calls on a limited call's thread before stranding it.
trait Strand {
    fn strand(&self);
}

impl<T> Strand for Call<T> {
    fn strand(&self) {
        if let Ok(mut phase) = self.phase.lock() {
            if matches!(*phase, Phase::Running) {
                *phase = Phase::Stranded;
                LEFT_BEHIND.fetch_add(1, Ordering::AcqRel);
            }
            // Left behind before: it was counted then, and stays counted for good.
        }
        self.changed.notify_all();
    }
}

extern "C" fn stranded(data: *mut c_void) {
    // SAFETY: `data` points to the `&dyn Strand` on the stack of the thread that passed it to
    // `llamactx_work_limit_begin`, alive as long as its call (and for good once stranded).
    let call = unsafe { &*data.cast::<&dyn Strand>() };
    call.strand();
}

/// Runs `work` (calls into llama.cpp's Jinja engine, given `input_bytes` of input) within the
/// limit, on a thread of its own. When the limit stopped it, the error is `ChatTemplateError`
/// kind `WorkLimit`, or the `KeyboardInterrupt` of a Ctrl-C, whatever `work` reported.
pub fn limited<T: Send + 'static>(input_bytes: usize, work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let left_behind = LEFT_BEHIND.load(Ordering::Acquire);
    if left_behind >= MAX_LEFT_BEHIND {
        return Err(stopped_error(format!(
            "{left_behind} earlier chat template calls went past their limits and still hold their \
             threads; no other runs until one ends"
        )));
    }
    let (allocations, bytes, nanos, heap_growth) = budget(input_bytes);
    let watch = SigintWatch::start();
    let poll = watch.as_ref().map(|_| interrupted as extern "C" fn() -> bool);
    let call = Arc::new(Call {
        phase: Mutex::new(Phase::Running),
        changed: Condvar::new(),
        abandoned: AtomicBool::new(false),
    });
    let on_thread = Arc::clone(&call);
    std::thread::Builder::new()
        .name("llamactx-template".to_owned())
        .spawn(move || {
            let strand: &dyn Strand = &*on_thread;
            // SAFETY: begin and end only set this thread's counters; they bracket `work` on this
            // thread. `abandoned` and `strand` live until the end of this closure, or for good
            // once the thread is stranded.
            unsafe {
                llamactx_work_limit_begin(
                    allocations,
                    bytes,
                    nanos,
                    heap_growth,
                    poll,
                    on_thread.abandoned.as_ptr().cast_const(),
                    Some(stranded),
                    std::ptr::from_ref(&strand).cast_mut().cast(),
                );
            }
            // A panic must end the call, not only its thread: the caller would wait out the
            // deadline and count the thread as left behind for good.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                .unwrap_or_else(|_| Err(Error::Panic("the chat template call panicked".to_owned())));
            // SAFETY: as above.
            let stopped = unsafe { llamactx_work_limit_end() };
            if let Ok(mut phase) = on_thread.phase.lock() {
                if matches!(*phase, Phase::LeftBehind) {
                    LEFT_BEHIND.fetch_sub(1, Ordering::AcqRel);
                } else {
                    *phase = Phase::Finished(outcome, stopped);
                }
            }
            on_thread.changed.notify_all();
        })
        .map_err(|err| Error::value(format!("cannot start a thread for the chat template: {err}")))?;
    let waited = Duration::from_nanos(nanos).saturating_add(GRACE);
    let phase = {
        let guard = call.phase.lock().map_err(|_| Error::Poisoned("chat template call"))?;
        let (mut phase, _) = call
            .changed
            .wait_timeout_while(guard, waited, |phase| matches!(phase, Phase::Running))
            .map_err(|_| Error::Poisoned("chat template call"))?;
        if matches!(*phase, Phase::Running) {
            *phase = Phase::LeftBehind;
            call.abandoned.store(true, Ordering::Release);
            LEFT_BEHIND.fetch_add(1, Ordering::AcqRel);
        }
        std::mem::replace(&mut *phase, Phase::LeftBehind)
    };
    drop(watch);
    match phase {
        Phase::Finished(outcome, 0) => outcome,
        Phase::Finished(_, 2) => Err(Python::attach(|py| py.check_signals()).err().map_or_else(
            || stopped_error("the chat template was interrupted".to_owned()),
            foreign,
        )),
        Phase::Finished(_, 3) | Phase::Running | Phase::LeftBehind => Err(stopped_error(format!(
            "the chat template ran past its time ({} s for {input_bytes} bytes of input): a template \
             that works this long is refused",
            waited.as_secs()
        ))),
        Phase::Finished(_, 4) => Err(stopped_error(format!(
            "the chat template's memory grew past its limit ({} MiB for {input_bytes} bytes of input)",
            heap_growth >> 20
        ))),
        Phase::Stranded => Err(stopped_error(
            "the chat template's C++ code ended in std::terminate (llama.cpp cannot stop it there); its \
             thread is left behind"
                .to_owned(),
        )),
        Phase::Finished(..) => Err(stopped_error(format!(
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
        assert_eq!(
            budget(0),
            (MAX_ALLOCATIONS, MAX_BYTES, SECONDS * 1_000_000_000, HEAP_GROWTH)
        );
        let (allocations, bytes, nanos, heap) = budget(200_000);
        assert_eq!(allocations, MAX_ALLOCATIONS + 200_000 * ALLOCATIONS_PER_INPUT_BYTE);
        assert_eq!(bytes, MAX_BYTES + 200_000 * BYTES_PER_INPUT_BYTE);
        assert_eq!(nanos, SECONDS * 1_000_000_000 + 200_000 * NANOS_PER_INPUT_BYTE);
        assert_eq!(heap, HEAP_GROWTH + 200_000 * HEAP_GROWTH_PER_INPUT_BYTE);
        assert_eq!(budget(usize::MAX), (u64::MAX, u64::MAX, u64::MAX, u64::MAX));
    }
}
