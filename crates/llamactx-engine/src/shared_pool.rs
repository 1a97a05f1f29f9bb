//! The compute threads of contexts that have no `ThreadPool` attached: one ggml pool per
//! thread count, shared by all such contexts and kept for the life of the process.
//!
//! Without a pool, ggml starts and joins its worker threads for every computation, which
//! measured about 20% slower generation on 2 cores. A pool per context would leave each
//! context's workers polling after its decode, starving the next context's decode (two
//! contexts decoding in turn: 34 tokens/s with a pool each, 138 with a shared one, in
//! `benches/pools.py`). Shared, the one polling worker is the one the next decode uses. A
//! pool runs one computation at a time: a context that finds its pool busy (another context
//! computing in another thread, which `cpu_budget` admits only where CPUs are left for both)
//! computes without one, as ggml does by default.

use std::sync::{Mutex, MutexGuard};

use llama_cpp_4::context::LlamaContext;
use llama_cpp_sys_4::ggml_threadpool;

use crate::threadpool::{PoolSettings, RawPool};

/// Distinct thread counts given their own shared pool; beyond, contexts compute without one.
const MAX_POOLS: usize = 4;

/// Shared pools by thread count. Leaked on purpose: they live as long as the process.
static POOLS: Mutex<Vec<(i32, &'static Mutex<RawPool>)>> = Mutex::new(Vec::new());

/// The shared pools one computation holds: for single-token and for batch graphs.
pub struct SharedPools {
    single: MutexGuard<'static, RawPool>,
    batch: Option<MutexGuard<'static, RawPool>>,
}

impl SharedPools {
    /// The pools for a context's thread counts, or None where one is busy or cannot start.
    pub fn take(n_threads: i32, n_threads_batch: i32) -> Option<Self> {
        let single = take(n_threads)?;
        let batch = if n_threads_batch == n_threads {
            None
        } else {
            Some(take(n_threads_batch)?)
        };
        Some(Self { single, batch })
    }

    /// The pools for `llama_attach_threadpool`: valid while `self` is held.
    fn raw(&self) -> (*mut ggml_threadpool, *mut ggml_threadpool) {
        let single = self.single.as_ptr();
        (single, self.batch.as_ref().map_or(single, |batch| batch.as_ptr()))
    }

    /// Runs `work` with these pools attached to `context`, detached again afterwards (also
    /// when `work` panics), so that no context points to a pool it does not hold.
    pub fn run_on<'a, T>(&self, context: &mut LlamaContext<'a>, work: impl FnOnce(&mut LlamaContext<'a>) -> T) -> T {
        struct Detach<'c, 'a>(&'c mut LlamaContext<'a>);
        impl Drop for Detach<'_, '_> {
            fn drop(&mut self) {
                self.0.detach_threadpool();
            }
        }
        let (single, batch) = self.raw();
        // SAFETY: the pools are locked by `self`, which outlives this call, and `Detach`
        // removes them from the context before it returns.
        unsafe { context.attach_threadpool(single, batch) };
        let attached = Detach(context);
        work(&mut *attached.0)
    }
}

/// The shared pool of `n_threads` threads, locked for one computation. `try_lock`
/// throughout: a lock left held by a thread that a fork did not copy must not hang the child.
fn take(n_threads: i32) -> Option<MutexGuard<'static, RawPool>> {
    let pool = {
        let mut pools = POOLS.try_lock().ok()?;
        match pools.iter().find(|(n, _)| *n == n_threads) {
            Some(&(_, pool)) => pool,
            None if pools.len() < MAX_POOLS => {
                let pool: &'static Mutex<RawPool> = Box::leak(Box::new(Mutex::new(
                    RawPool::new(n_threads, &PoolSettings::SHARED).ok()?,
                )));
                pools.push((n_threads, pool));
                pool
            }
            None => return None,
        }
    };
    let mut guard = pool.try_lock().ok()?;
    if !guard.usable() {
        // A forked child: the pool's threads stayed in the parent.
        *guard = RawPool::new(n_threads, &PoolSettings::SHARED).ok()?;
    }
    Some(guard)
}

#[cfg(test)]
mod tests {
    use super::SharedPools;

    #[test]
    fn a_busy_pool_is_not_handed_out_twice() {
        // No other unit test takes pools, so the global pools are this test's own. Thread
        // counts are at most 2: more than the CPUs are refused, and CI machines have 2.
        let first = SharedPools::take(2, 2).expect("a pool of 2 threads");
        assert!(SharedPools::take(2, 2).is_none(), "the pool is held by `first`");
        assert!(SharedPools::take(2, 1).is_none(), "one of the two pools is busy");
        let (single, batch) = first.raw();
        assert_eq!(single, batch, "equal thread counts use one pool");
        drop(first);
        let again = SharedPools::take(2, 1).expect("both pools free now");
        let (single, batch) = again.raw();
        assert_ne!(single, batch, "distinct thread counts use distinct pools");
    }
}
