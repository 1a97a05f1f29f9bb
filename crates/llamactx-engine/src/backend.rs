//! The one process-wide llama.cpp backend, and the bridge from llama.cpp's log to Python's
//! `logging`.
//!
//! llama.cpp may log from its worker threads while the thread that called it holds the GIL
//! and waits; a callback that took the GIL there would deadlock. So the callback only queues
//! complete lines, and `flush_logs` hands them to the `llamactx` logger from a thread that
//! holds the GIL, after every native call (see `native::detached`).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::errors::{Error, Result};
use llama_cpp_4::llama_backend::LlamaBackend;
use llama_cpp_sys_4::ggml_log_level;

/// Lines kept while nobody flushes them; older ones are dropped first.
const MAX_QUEUED_LINES: usize = 10_000;

static BACKEND: OnceLock<std::result::Result<LlamaBackend, String>> = OnceLock::new();

/// The process-wide backend, initialised (with the log bridge) on first use.
pub fn backend() -> Result<&'static LlamaBackend> {
    let initialised = BACKEND.get_or_init(|| {
        let backend = LlamaBackend::init().map_err(|err| err.to_string())?;
        // SAFETY: `queue_log_line` is a `'static` function with the signature llama.cpp
        // expects; it ignores `user_data`, so null is valid for the life of the process.
        unsafe { llama_cpp_4::log_set(Some(queue_log_line), std::ptr::null_mut()) };
        // SAFETY: as above; mtmd and clip (the multimodal projectors) have their own logger.
        unsafe { llama_cpp_sys_4::mtmd_helper_log_set(Some(queue_log_line), std::ptr::null_mut()) };
        Ok(backend)
    });
    initialised
        .as_ref()
        .map_err(|reason| Error::state("BackendInit", reason.clone()))
}

struct LogQueue {
    /// The line being assembled: llama.cpp sends a line in several calls.
    partial: String,
    partial_level: u32,
    lines: VecDeque<(u32, String)>,
}

static LOG_QUEUE: Mutex<LogQueue> = Mutex::new(LogQueue {
    partial: String::new(),
    partial_level: 0,
    lines: VecDeque::new(),
});
static LOGS_PENDING: AtomicBool = AtomicBool::new(false);

unsafe extern "C" fn queue_log_line(level: ggml_log_level, text: *const c_char, _user_data: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string that lives for this call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    // Nothing here may unwind into C: a poisoned queue only loses log lines.
    let _ = std::panic::catch_unwind(|| {
        capture_error(level, &text);
        if let Ok(mut queue) = LOG_QUEUE.lock() {
            queue.push(level, &text);
        }
    });
}

/// Most bytes of logged errors kept for one exception message.
const MAX_CAPTURED_BYTES: usize = 2048;

/// Errors llama.cpp logs on one thread while `capture_errors` runs there.
struct ErrorCapture {
    text: String,
    /// Whether the last piece was an error, so that its continuations belong to it.
    in_error: bool,
}

thread_local! {
    static CAPTURE: RefCell<Option<ErrorCapture>> = const { RefCell::new(None) };
}

fn capture_error(level: ggml_log_level, text: &str) {
    CAPTURE.with_borrow_mut(|capture| {
        let Some(capture) = capture else { return };
        if level != llama_cpp_sys_4::GGML_LOG_LEVEL_CONT {
            capture.in_error = level == llama_cpp_sys_4::GGML_LOG_LEVEL_ERROR;
        }
        if capture.in_error && capture.text.len() < MAX_CAPTURED_BYTES {
            capture.text.push_str(text);
        }
    });
}

/// Runs a fallible llama.cpp call; its error carries what llama.cpp logged as errors meanwhile.
pub fn explained<T, E>(call: impl FnOnce() -> std::result::Result<T, E>) -> Result<T>
where
    Error: From<E>,
{
    let (result, logged) = capture_errors(call);
    result.map_err(|err| Error::from(err).with_logged_reason(&logged))
}

/// Runs `work` and returns, beside its result, what llama.cpp logged as errors on this thread
/// meanwhile, lines joined by "; " (its return codes alone often do not say what was wrong).
pub fn capture_errors<T>(work: impl FnOnce() -> T) -> (T, String) {
    /// Stops capturing even when `work` panics.
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            CAPTURE.set(None);
        }
    }
    CAPTURE.set(Some(ErrorCapture {
        text: String::new(),
        in_error: false,
    }));
    let stop = Stop;
    let result = work();
    let text = CAPTURE.take().map(|capture| capture.text).unwrap_or_default();
    drop(stop);
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|line| !line.is_empty()).collect();
    (result, lines.join("; "))
}

impl LogQueue {
    fn push(&mut self, level: u32, text: &str) {
        if level != llama_cpp_sys_4::GGML_LOG_LEVEL_CONT {
            self.partial_level = level;
        }
        self.partial.push_str(text);
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            let line = line.trim_end().to_owned();
            if !line.is_empty() {
                self.push_line(self.partial_level, line);
            }
        }
    }

    fn push_line(&mut self, level: u32, line: String) {
        if self.lines.len() == MAX_QUEUED_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back((level, line));
        LOGS_PENDING.store(true, Ordering::Release);
    }
}

/// Queues `line` as a warning of the `llamactx` logger, beside llama.cpp's own lines (emitted
/// at the next call from Python).
pub fn log_warning(line: String) {
    if let Ok(mut queue) = LOG_QUEUE.lock() {
        queue.push_line(llama_cpp_sys_4::GGML_LOG_LEVEL_WARN, line);
    }
}

/// The lines queued for Python's logger (for tests of what Rust logs).
#[cfg(test)]
pub fn queued_log_lines() -> Vec<String> {
    LOG_QUEUE
        .lock()
        .map(|queue| queue.lines.iter().map(|(_, line)| line.clone()).collect())
        .unwrap_or_default()
}

/// The log lines queued since the last call, oldest first, with their ggml levels; None when
/// none was queued (cheap: one atomic read).
pub fn pending_log_lines() -> Option<Vec<(u32, String)>> {
    if !LOGS_PENDING.swap(false, Ordering::AcqRel) {
        return None;
    }
    Some(LOG_QUEUE.lock().ok()?.lines.drain(..).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assembles_continued_lines_with_the_first_level() {
        let mut queue = LogQueue {
            partial: String::new(),
            partial_level: 0,
            lines: VecDeque::new(),
        };
        queue.push(llama_cpp_sys_4::GGML_LOG_LEVEL_WARN, "half ");
        queue.push(llama_cpp_sys_4::GGML_LOG_LEVEL_CONT, "line\nnext");
        assert_eq!(
            queue.lines,
            [(llama_cpp_sys_4::GGML_LOG_LEVEL_WARN, "half line".to_owned())]
        );
        assert_eq!(queue.partial, "next");
    }
}
