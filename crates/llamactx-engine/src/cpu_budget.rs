//! Process-wide admission of computations by thread count: the threads computing at once never
//! exceed the CPUs this process may use.
//!
//! ggml's workers spin at barriers, so oversubscribed CPUs do not just share time: a thread
//! that is descheduled stalls every other thread of its graph at the next barrier. Two
//! contexts decoding with 2 threads each on 2 CPUs went from milliseconds to seconds per token.
//! A computation therefore waits until its threads fit; waiting computations are admitted in
//! the order they arrived, so a thread that decodes in a tight loop cannot starve the others.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::threadpool::available_cpus;

/// How often a waiting computation polls its abort callback (Ctrl-C, a Python callable).
const ABORT_POLL: Duration = Duration::from_millis(5);

struct Budget {
    /// The process these counts belong to: a forked child starts with none of its parent's
    /// computations or waiters.
    pid: u32,
    threads_in_use: i32,
    /// Tickets of the waiting computations, first come first.
    waiting: VecDeque<u64>,
    next_ticket: u64,
}

static BUDGET: Mutex<Budget> = Mutex::new(Budget {
    pid: 0,
    threads_in_use: 0,
    waiting: VecDeque::new(),
    next_ticket: 0,
});
static CHANGED: Condvar = Condvar::new();

/// `threads` CPUs held for one computation, returned on drop.
pub struct CpuShare {
    threads: i32,
}

/// The budget, reset in a process forked since it was last used. The lock is held only for
/// a few instructions at a time, never across a computation or a wait.
fn budget() -> MutexGuard<'static, Budget> {
    let mut budget = BUDGET.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let pid = std::process::id();
    if budget.pid != pid {
        *budget = Budget {
            pid,
            threads_in_use: 0,
            waiting: VecDeque::new(),
            next_ticket: 0,
        };
    }
    budget
}

impl CpuShare {
    /// Waits for `threads` CPUs (a computation alone always runs). `aborted` is polled while
    /// waiting; when it returns true, the wait ends with `None`.
    pub fn claim(threads: i32, mut aborted: impl FnMut() -> bool) -> Option<Self> {
        let cpus = available_cpus();
        let mut budget = budget();
        let ticket = budget.next_ticket;
        budget.next_ticket += 1;
        budget.waiting.push_back(ticket);
        loop {
            let first = budget.waiting.front() == Some(&ticket);
            if first && (budget.threads_in_use == 0 || budget.threads_in_use + threads <= cpus) {
                budget.waiting.pop_front();
                budget.threads_in_use += threads;
                drop(budget);
                // The next in line may fit beside this one.
                CHANGED.notify_all();
                return Some(Self { threads });
            }
            let (guard, _) = CHANGED
                .wait_timeout(budget, ABORT_POLL)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            drop(guard);
            // Polled without the lock: the callback may run Python.
            if aborted() {
                budget = self::budget();
                budget.waiting.retain(|waiting| *waiting != ticket);
                drop(budget);
                CHANGED.notify_all();
                return None;
            }
            budget = self::budget();
        }
    }
}

impl Drop for CpuShare {
    fn drop(&mut self) {
        let mut budget = budget();
        budget.threads_in_use = (budget.threads_in_use - self.threads).max(0);
        drop(budget);
        CHANGED.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::CpuShare;
    use crate::threadpool::available_cpus;

    #[test]
    fn computations_beyond_the_cpus_wait_their_turn() {
        let cpus = available_cpus();
        let all = CpuShare::claim(cpus, || false).expect("nothing else computes");
        let mut polls = 0;
        let waited = CpuShare::claim(1, || {
            polls += 1;
            polls == 3
        });
        assert!(waited.is_none(), "no CPU was free, so the wait ended by its abort");
        assert_eq!(polls, 3);
        drop(all);
        let one = CpuShare::claim(1, || panic!("a free CPU needs no wait"));
        assert!(one.is_some());
    }
}
