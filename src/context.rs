//! `LlamaContext`: an `OpenContext` (the crate's `LlamaContext<'model>` beside the `Arc` of its
//! model, `open_context.rs`) behind a lock, so that every call is safe from Python.
//!
//! The methods live by theme in the submodules; this file holds the type, its creation and its
//! lifetime (close, context manager).

mod abort;
mod adapters;
mod attachments;
mod compute;
mod introspection;
mod kv;
mod outputs;
pub(crate) mod params;
mod state;

use llama_cpp_4::context::LlamaContext;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::closing::closed_by_with;
use crate::errors::python::to_py;
use crate::errors::{Error, Result};
use crate::gil::detached;
use crate::model::python::PyLlamaModel;
pub use crate::open_context::{ContextOptions, OpenContext};
use crate::owned_lock::OwnedMutex;
use abort::PythonAbortCheck;

/// A llama.cpp context: KV cache, compute buffers and outputs of one model.
///
/// Every method takes the context's lock with the GIL released, so threads sharing a context
/// are serialised and other Python threads keep running meanwhile.
#[pyclass(frozen, module = "llamactx", name = "LlamaContext")]
pub struct PyLlamaContext {
    native: OwnedMutex<Option<OpenContext>>,
    model: Py<PyLlamaModel>,
}

closed_by_with!(PyLlamaContext);

impl PyLlamaContext {
    pub fn create(model: &Bound<'_, PyLlamaModel>, options: ContextOptions) -> PyResult<Self> {
        let native_model = model.get().native().map_err(to_py)?;
        let learned_positions = model.get().learned_positions();
        let native = detached(model.py(), move || {
            OpenContext::open(native_model, &options, learned_positions)
        })?;
        Ok(Self {
            native: OwnedMutex::new(Some(native), "LlamaContext"),
            model: model.clone().unbind(),
        })
    }

    /// Runs `work` on the open native context, holding its lock, with the GIL released.
    pub fn run<T, F>(&self, py: Python<'_>, work: F) -> PyResult<T>
    where
        F: FnOnce(&mut OpenContext) -> Result<T> + Send,
        T: Send,
    {
        detached(py, || self.with_open(work))
    }

    /// Runs `work` on the open native context, holding its lock (in the calling thread, whether
    /// or not it holds the GIL): `ValueError` once closed, `RpcError` once an RPC server failed.
    pub fn with_open<T>(&self, work: impl FnOnce(&mut OpenContext) -> Result<T>) -> Result<T> {
        let mut guard = self.native.lock()?;
        let native = guard.as_mut().ok_or_else(|| Error::closed("LlamaContext"))?;
        native.check_rpc()?;
        let done = work(native);
        native.check_rpc()?;
        done
    }

    /// Like `run`, for work that only reads the context.
    fn read<T, F>(&self, py: Python<'_>, read: F) -> PyResult<T>
    where
        F: for<'a> FnOnce(&LlamaContext<'a>) -> T + Send,
        T: Send,
    {
        self.run(py, |native| Ok(native.with(read)))
    }
}

#[pymethods]
impl PyLlamaContext {
    /// The `LlamaModel` this context was made from.
    #[getter]
    fn model(&self, py: Python<'_>) -> Py<PyLlamaModel> {
        self.model.clone_ref(py)
    }

    /// Size of the context (KV cells), as llama.cpp padded it.
    fn n_ctx(&self, py: Python<'_>) -> PyResult<u32> {
        self.read(py, |context| context.n_ctx())
    }

    /// Context size available to each sequence.
    fn n_ctx_seq(&self, py: Python<'_>) -> PyResult<u32> {
        self.read(py, |context| context.n_ctx_seq())
    }

    /// Most tokens one `decode` call accepts.
    fn n_batch(&self, py: Python<'_>) -> PyResult<u32> {
        self.read(py, |context| context.n_batch())
    }

    /// Physical micro-batch size.
    fn n_ubatch(&self, py: Python<'_>) -> PyResult<u32> {
        self.read(py, |context| context.n_ubatch())
    }

    /// Number of sequences the context holds.
    fn n_seq_max(&self, py: Python<'_>) -> PyResult<u32> {
        self.read(py, |context| context.n_seq_max())
    }

    /// Threads used for single-token decoding.
    fn n_threads(&self, py: Python<'_>) -> PyResult<i32> {
        self.read(py, |context| context.n_threads())
    }

    /// Threads used for batch (prompt) decoding.
    fn n_threads_batch(&self, py: Python<'_>) -> PyResult<i32> {
        self.read(py, |context| context.n_threads_batch())
    }

    /// Frees the native context now. Later calls raise `ValueError`.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let native = detached(py, || Ok(self.native.lock()?.take()))?;
        // Dropped with the GIL held: freeing is quick, and nothing native waits on Python.
        drop(native);
        Ok(())
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        // `try_lock`: waiting for the lock with the GIL held could deadlock against a decode
        // whose abort callback needs the GIL. A busy context is open.
        match self.native.try_lock() {
            Ok(Some(guard)) => guard.is_none(),
            Ok(None) => false,
            Err(_) => true,
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> std::result::Result<(), PyTraverseError> {
        visit.call(&self.model)?;
        // Never wait here: the collector runs with the GIL held, which a decode may need.
        if let Ok(Some(guard)) = self.native.try_lock() {
            if let Some(native) = guard.as_ref() {
                native
                    .abort_flags
                    .visit_callback(|check| match check.as_any().downcast_ref::<PythonAbortCheck>() {
                        Some(callable) => visit.call(&callable.0),
                        None => Ok(()),
                    })?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Ok(Some(guard)) = self.native.try_lock() {
            if let Some(native) = guard.as_ref() {
                native.abort_flags.clear();
            }
        }
    }

    fn __repr__(&self) -> String {
        match self.native.try_lock() {
            Ok(Some(guard)) => match guard.as_ref() {
                Some(native) => native.with(|context| format!("<LlamaContext n_ctx={}>", context.n_ctx())),
                None => "<LlamaContext (closed)>".to_owned(),
            },
            Ok(None) => "<LlamaContext (busy)>".to_owned(),
            Err(_) => "<LlamaContext (poisoned)>".to_owned(),
        }
    }
}
