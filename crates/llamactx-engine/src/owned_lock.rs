//! A mutex that knows which thread holds it.
//!
//! Two waits could never end with a plain mutex: a Python callback that runs while its caller
//! holds the lock (the abort callback during a decode) asking for the same lock again, and a
//! forked child asking for a lock that a thread of its parent held at the fork (that thread
//! does not exist in the child). Both get an error instead.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use crate::errors::{Error, Result};

/// No holder.
const FREE: u64 = 0;

/// The calling thread as `pid << 32 | tid` (Linux ids fit 32 bits and are never 0).
fn this_thread() -> u64 {
    // SAFETY: getpid only reads the calling process's id.
    let pid = unsafe { libc::getpid() };
    (u64::from(pid.unsigned_abs()) << 32) | u64::from(kernel_thread_id().unsigned_abs())
}

/// The calling thread's kernel id, by the gettid system call: glibc's wrapper of it is newer
/// (2.30) than the glibc the wheel is built for (manylinux_2_28).
pub fn kernel_thread_id() -> libc::pid_t {
    // SAFETY: gettid only reads the calling thread's id.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    libc::pid_t::try_from(tid).unwrap_or_default()
}

fn process_of(holder: u64) -> u64 {
    holder >> 32
}

pub struct OwnedMutex<T> {
    inner: Mutex<T>,
    holder: AtomicU64,
    /// The Python class name, for error messages.
    name: &'static str,
}

pub struct OwnedGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    holder: &'a AtomicU64,
}

impl<T> OwnedMutex<T> {
    pub const fn new(value: T, name: &'static str) -> Self {
        Self {
            inner: Mutex::new(value),
            holder: AtomicU64::new(FREE),
            name,
        }
    }

    /// Waits for the lock, unless this thread holds it already or its holder is a thread that
    /// a fork left behind.
    pub fn lock(&self) -> Result<OwnedGuard<'_, T>> {
        let me = this_thread();
        let holder = self.holder.load(Ordering::Acquire);
        if holder == me {
            return Err(Error::Runtime(format!(
                "{} is in use by this thread: a callback cannot call back into the {} that is running it",
                self.name, self.name
            )));
        }
        let guard = match self.inner.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(_)) => return Err(Error::Poisoned(self.name)),
            Err(TryLockError::WouldBlock) => {
                if holder != FREE && process_of(holder) != process_of(me) {
                    return Err(Error::Runtime(format!(
                        "{} was in use by another thread when this process was forked; that thread does not \
                         exist here, so it cannot be used in this process",
                        self.name
                    )));
                }
                self.inner.lock().map_err(|_| Error::Poisoned(self.name))?
            }
        };
        self.holder.store(me, Ordering::Release);
        Ok(OwnedGuard {
            guard,
            holder: &self.holder,
        })
    }

    /// The lock if it is free now; `None` if it is busy, an error if poisoned.
    pub fn try_lock(&self) -> Result<Option<MutexGuard<'_, T>>> {
        match self.inner.try_lock() {
            Ok(guard) => Ok(Some(guard)),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Poisoned(_)) => Err(Error::Poisoned(self.name)),
        }
    }
}

impl<T> Drop for OwnedGuard<'_, T> {
    fn drop(&mut self) {
        self.holder.store(FREE, Ordering::Release);
    }
}

impl<T> Deref for OwnedGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for OwnedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_thread_is_refused_not_awaited() {
        let mutex = OwnedMutex::new(1, "Thing");
        let guard = mutex.lock().unwrap();
        assert!(matches!(mutex.lock(), Err(Error::Runtime(_))));
        drop(guard);
        assert_eq!(*mutex.lock().unwrap(), 1);
    }

    #[test]
    fn a_lock_held_by_a_thread_of_another_process_is_refused() {
        let mutex = OwnedMutex::new(1, "Thing");
        let guard = mutex.inner.lock().unwrap();
        mutex.holder.store((u64::from(u32::MAX) << 32) | 7, Ordering::Release);
        assert!(matches!(mutex.lock(), Err(Error::Runtime(_))));
        drop(guard);
    }
}
