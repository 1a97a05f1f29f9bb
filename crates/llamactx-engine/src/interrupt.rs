//! Ctrl-C during a decode on Python's main thread.
//!
//! Python's own SIGINT handler only sets a flag that the interpreter checks between bytecodes,
//! which never happens while the main thread waits in llama.cpp. For the length of a
//! main-thread decode, `SigintWatch` installs a handler that also sets `INTERRUPTED` (which the
//! abort callback polls after every graph node) and then calls Python's handler, so Python
//! still raises `KeyboardInterrupt` once the aborted decode returns.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// The handler `SigintWatch` replaced, as a `sighandler_t` (0 when none is installed).
static PREVIOUS_HANDLER: AtomicUsize = AtomicUsize::new(0);

/// Whether SIGINT arrived during the current watched decode (only the decodes that hold a
/// `SigintWatch` ask: Ctrl-C is for the main thread's work, not every thread's).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Acquire)
}

extern "C" fn on_sigint(signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Release);
    let previous = PREVIOUS_HANDLER.load(Ordering::Acquire);
    if previous != 0 {
        // SAFETY: `previous` is the handler function that was installed for SIGINT before
        // ours (never SIG_DFL/SIG_IGN, see `SigintWatch::start`); calling it from a signal
        // handler is what the kernel would have done.
        let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(previous) };
        handler(signal);
    }
}

/// Our SIGINT handler for as long as this value lives; the previous one is restored on drop.
/// A watch started while another is active (a decode inside a callback of a decode) shares it.
pub struct SigintWatch {
    /// The handler to restore, or `None` for a watch nested in another.
    previous: Option<libc::sigaction>,
}

impl SigintWatch {
    /// Starts watching when called on the process's main thread (the only thread Python runs
    /// signal handlers on) and a Python handler is installed; otherwise does nothing.
    pub fn start() -> Option<Self> {
        if !on_main_thread() {
            return None;
        }
        // SAFETY: plain sigaction calls with zeroed, then filled, structs that live on this
        // stack; only the main thread installs or restores, so they cannot interleave.
        unsafe {
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGINT, std::ptr::null(), &raw mut previous) != 0 {
                return None;
            }
            let current = previous.sa_sigaction;
            let ours = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
            if current == ours {
                // Installing again would make our handler call itself forever.
                return Some(Self { previous: None });
            }
            if current == libc::SIG_DFL || current == libc::SIG_IGN || previous.sa_flags & libc::SA_SIGINFO != 0 {
                return None;
            }
            INTERRUPTED.store(false, Ordering::Release);
            PREVIOUS_HANDLER.store(current, Ordering::Release);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ours;
            action.sa_flags = previous.sa_flags;
            action.sa_mask = previous.sa_mask;
            if libc::sigaction(libc::SIGINT, &raw const action, std::ptr::null_mut()) != 0 {
                return None;
            }
            Some(Self {
                previous: Some(previous),
            })
        }
    }
}

impl Drop for SigintWatch {
    fn drop(&mut self) {
        if let Some(previous) = &self.previous {
            // SAFETY: restores the handler saved by `start`, from the same (main) thread.
            unsafe { libc::sigaction(libc::SIGINT, previous, std::ptr::null_mut()) };
            PREVIOUS_HANDLER.store(0, Ordering::Release);
        }
    }
}

#[cfg(target_os = "linux")]
fn on_main_thread() -> bool {
    // SAFETY: getpid only reads the calling process's id.
    crate::owned_lock::kernel_thread_id() == unsafe { libc::getpid() }
}

#[cfg(not(target_os = "linux"))]
fn on_main_thread() -> bool {
    false
}
