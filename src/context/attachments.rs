//! What the context hands to llama.cpp and must keep alive: the abort callback, thread pools
//! and backend samplers.

use std::sync::Arc;

use llama_cpp_4::sampling::LlamaSampler;
use pyo3::prelude::*;

use super::abort::PythonAbortCheck;
use super::PyLlamaContext;
use crate::errors::python::to_py;
use crate::errors::Error;
use crate::open_context::abort::AbortCheck;
use crate::sampler::python::PyLlamaSampler;
use crate::threadpool::python::PyThreadPool;
use crate::threadpool::PoolLease;

#[pymethods]
impl PyLlamaContext {
    /// Sets `callback()` to be polled while llama.cpp computes (about every 5 ms, on the
    /// decoding thread); a truthy result stops the decode, which then raises `DecodeAborted`
    /// and leaves nothing of the batch in the KV cache. An exception in the callback also
    /// stops it and is re-raised. `None` removes the callback (Ctrl-C still interrupts).
    fn set_abort_callback(&self, py: Python<'_>, callback: Option<Py<PyAny>>) -> PyResult<()> {
        if let Some(callback) = &callback {
            if !callback.bind(py).is_callable() {
                return Err(to_py(Error::Type(
                    "the abort callback must be callable or None".to_owned(),
                )));
            }
        }
        let check = callback.map(|callback| Arc::new(PythonAbortCheck(callback)) as Arc<dyn AbortCheck>);
        self.run(py, |native| native.abort_flags.set_callback(check))
    }

    /// Runs computation on `threadpool` (and batches on `threadpool_batch`, default the same
    /// pool) instead of the pools that contexts share by default. The context keeps the pools
    /// alive until `detach_threadpool` or close; a pool serves one context at a time.
    #[pyo3(signature = (threadpool, threadpool_batch=None))]
    fn attach_threadpool(
        &self,
        py: Python<'_>,
        threadpool: Py<PyThreadPool>,
        threadpool_batch: Option<Py<PyThreadPool>>,
    ) -> PyResult<()> {
        let batch_pool = threadpool_batch.filter(|batch| !batch.is(&threadpool));
        self.run(py, |native| {
            native.detach_pools();
            let (lease, raw) = PoolLease::attach(Arc::clone(&threadpool.get().0))?;
            let mut leases = vec![lease];
            let raw_batch = match batch_pool {
                Some(pool) => {
                    let (lease, raw_batch) = PoolLease::attach(Arc::clone(&pool.get().0))?;
                    leases.push(lease);
                    raw_batch
                }
                None => raw,
            };
            // SAFETY: the pools stay alive while `native.pools` holds their leases, which are
            // dropped only after `detach_threadpool` or after the context itself is freed.
            native.with_mut(|context| unsafe { context.attach_threadpool(raw, raw_batch) });
            native.pools = leases;
            Ok(())
        })
    }

    /// Releases the attached pools and goes back to the shared ones.
    fn detach_threadpool(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |native| {
            native.detach_pools();
            Ok(())
        })
    }

    /// Samples sequence `seq_id` inside llama.cpp's graph (backend sampling) with a copy of
    /// `sampler` (wrapped in a chain if it is not one), kept by the context; `None` removes
    /// it. Returns True; `StateError` when llama.cpp cannot run that sampler on the backend.
    /// While any backend sampler is set, read results with the `get_sampled_*` methods:
    /// full logits rows are not available.
    fn set_sampler(&self, py: Python<'_>, seq_id: i64, sampler: Option<Py<PyLlamaSampler>>) -> PyResult<bool> {
        let copy = match &sampler {
            Some(sampler) => Some(sampler.get().backend_copy(py)?),
            None => None,
        };
        self.run(py, |native| {
            let seq_id = native.seq(seq_id)?;
            if let Some(sampler) = &sampler {
                sampler.get().check_backend(native.n_vocab)?;
            }
            // The last decode's outputs were written for the samplers it ran with: with a backend
            // sampler, llama.cpp keeps no full logits, and what its buffer holds is stale.
            native.output_rows.clear();
            let accepted = if let Some(copy) = copy {
                let mut copy: LlamaSampler = copy.0;
                let accepted = native.with_mut(|context| context.set_sampler(seq_id, &mut copy));
                // llama.cpp dropped its pointer to the previous sampler either way.
                if accepted {
                    native.backend_samplers.insert(seq_id, copy);
                } else {
                    native.backend_samplers.remove(&seq_id);
                }
                accepted
            } else {
                // SAFETY: a null sampler removes the sequence's sampler; the live context
                // pointer comes from the cell.
                let removed = native.with_mut(|context| unsafe {
                    llama_cpp_sys_4::llama_set_sampler(context.as_ptr(), seq_id, std::ptr::null_mut())
                });
                native.backend_samplers.remove(&seq_id);
                removed
            };
            if accepted {
                Ok(true)
            } else {
                Err(Error::state(
                    "SetSampler",
                    "llama.cpp cannot run this sampler on the backend",
                ))
            }
        })
    }
}
