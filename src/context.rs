//! `LlamaContext`: the crate's `LlamaContext<'model>` kept beside the `Arc` of its model, behind
//! a lock, with the bookkeeping that makes every call safe from Python.
//!
//! The methods live by theme in the submodules; this file holds the type, its creation and its
//! lifetime (close, context manager).

mod abort;
pub(crate) mod adapters;
mod attachments;
mod compute;
mod introspection;
mod kv;
mod media;
mod memory_budget;
mod outputs;
mod params;
mod rollback;
mod state;
mod state_layout;

use std::collections::BTreeMap;
use std::sync::Arc;

use llama_cpp_4::context::LlamaContext;
use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::sampling::LlamaSampler;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};
use self_cell::self_cell;

use crate::backend::{backend, explained};
use crate::errors::{Error, Result};
use crate::gil::detached;
use crate::lora::AdapterLease;
use crate::model::PyLlamaModel;
use crate::owned_lock::OwnedMutex;
use crate::rpc::{self, ModelLinks};
use crate::threadpool::PoolLease;
use abort::AbortFlags;
pub use params::ContextOptions;

self_cell!(
    /// The native context, borrowing the model it owns an `Arc` of.
    struct ContextCell {
        owner: Arc<LlamaModel>,
        #[not_covariant]
        dependent: LlamaContext,
    }
);

/// Everything behind the context's lock.
///
/// Field order matters: `cell` (the llama.cpp context) is dropped first, so everything after
/// it that llama.cpp holds pointers to (abort flags, samplers, adapter, pools) outlives it.
// The flags mirror independent llama.cpp settings; an enum would not make them clearer.
#[allow(clippy::struct_excessive_bools)]
pub struct OpenContext {
    cell: ContextCell,
    abort_flags: Box<AbortFlags>,
    /// Copies given to `llama_set_sampler`, by sequence.
    backend_samplers: BTreeMap<i32, LlamaSampler>,
    lora: Option<AdapterLease>,
    pools: Vec<PoolLease>,
    /// Batch indices of the rows that hold outputs (logits, embeddings) now. The crate keeps
    /// the same list privately and panics on a row outside it [llama.cpp internal]; ours is
    /// also emptied when a state restore leaves llama.cpp without outputs, which the crate
    /// does not track.
    output_rows: Vec<i32>,
    /// Sequences of the last successful batch (their pooled embeddings are current).
    output_seqs: Vec<i32>,
    n_vocab: i32,
    n_seq_max: u32,
    n_batch: u32,
    n_ubatch: u32,
    embeddings: bool,
    causal_attn: bool,
    has_encoder: bool,
    /// An encoder-decoder model whose decoder has no encoder output to attend to yet: llama.cpp
    /// asserts on such a decode. Only a successful `encode` provides one; a state restore does
    /// not carry it.
    awaits_encoder: bool,
    /// One KV stream for all sequences (`kv_unified=True`) instead of one per sequence.
    kv_unified: bool,
    /// False for a K cache type the CPU cannot RoPE-shift (see `can_shift`).
    k_cache_shifts: bool,
    /// False for models without a KV cache (BERT-style): llama.cpp's memory calls would
    /// dereference null.
    has_memory: bool,
    /// The RPC servers of its model, whose failure makes every later call an `RpcError`.
    rpc: Option<Arc<ModelLinks>>,
    /// For a model with learned position embeddings, how many positions they hold: llama.cpp
    /// pads `n_ctx` to a multiple of 256 and reads the table's row for each position
    /// (`GGML_ASSERT` past it), so no batch may reach past them.
    position_limit: Option<i32>,
}

// SAFETY: `LlamaContext` and `LlamaSampler` are `!Send` only because they hold raw pointers
// to llama.cpp objects. llama.cpp keeps no thread-local state in a context: it may be used from
// any thread, one at a time. `OpenContext` is only reachable through the `OwnedMutex` in
// `PyLlamaContext`, which gives exactly that: one thread at a time. The model it points to
// is `Send + Sync` and owned by the same cell through an `Arc`.
unsafe impl Send for OpenContext {}

impl OpenContext {
    /// The model this context runs.
    pub fn model(&self) -> &Arc<LlamaModel> {
        self.cell.borrow_owner()
    }

    /// The positions one sequence may hold: llama.cpp's `n_ctx_seq`, or fewer where learned
    /// position embeddings end first.
    pub fn positions_per_sequence(&self) -> u32 {
        let n_ctx_seq = self.with(|context| context.n_ctx_seq());
        self.position_limit
            .map_or(n_ctx_seq, |limit| n_ctx_seq.min(u32::try_from(limit).unwrap_or(0)))
    }

    /// Whether all sequences share one KV stream (`kv_unified=True`).
    pub fn kv_unified(&self) -> bool {
        self.kv_unified
    }

    /// Creates a context of `model` with `options` (checked here), ready to compute;
    /// `learned_positions` (`PyLlamaModel::learned_positions`) bounds its `n_ctx`.
    pub fn open(native_model: Arc<LlamaModel>, options: &ContextOptions, learned_positions: bool) -> Result<Self> {
        let rpc = rpc::links_of(&native_model);
        let has_encoder = native_model.has_encoder();
        let encoder_decoder = has_encoder && native_model.has_decoder();
        let position_limit = learned_positions.then(|| i32::try_from(native_model.n_ctx_train()).unwrap_or(i32::MAX));
        let bounded;
        let options = if learned_positions {
            bounded = options.within_positions(native_model.n_ctx_train())?;
            &bounded
        } else {
            options
        };
        options.check_for_model(native_model.n_ctx_train(), encoder_decoder)?;
        memory_budget::check_host_memory(options, &native_model)?;
        let params = options.to_params()?;
        let backend = backend()?;
        let n_vocab = native_model.n_vocab();
        let cell = ContextCell::try_new(native_model, |model| explained(|| model.new_context(backend, params)))?;
        let (n_seq_max, n_batch, n_ubatch, has_memory, causal_attn) = cell.with_dependent(|_, context| {
            let raw = context.as_ptr();
            // SAFETY: `raw` is the live context this cell owns; both calls only read it.
            let (memory, causal) = unsafe {
                (
                    llama_cpp_sys_4::llama_get_memory(raw),
                    llama_cpp_sys_4::llama_get_causal_attn(raw),
                )
            };
            (
                context.n_seq_max(),
                context.n_batch(),
                context.n_ubatch(),
                !memory.is_null(),
                causal,
            )
        });
        let mut native = OpenContext {
            cell,
            abort_flags: Box::default(),
            backend_samplers: BTreeMap::new(),
            lora: None,
            pools: Vec::new(),
            output_rows: Vec::new(),
            output_seqs: Vec::new(),
            n_vocab,
            n_seq_max,
            n_batch,
            n_ubatch,
            embeddings: false,
            causal_attn,
            has_encoder,
            awaits_encoder: encoder_decoder,
            kv_unified: options.kv_unified.unwrap_or(false),
            k_cache_shifts: !options
                .cache_type_k
                .as_deref()
                .is_some_and(|name| name.eq_ignore_ascii_case("bf16")),
            has_memory,
            rpc,
            position_limit,
        };
        native.check_rpc()?;
        if options.embeddings == Some(true) {
            native.enable_embeddings(true)?;
        }
        native.register_abort_flags();
        Ok(native)
    }

    /// Registers the abort callback for the life of the context (Ctrl-C needs it even
    /// without a Python callback).
    fn register_abort_flags(&mut self) {
        let data = std::ptr::from_ref::<AbortFlags>(&self.abort_flags)
            .cast_mut()
            .cast::<std::ffi::c_void>();
        // SAFETY: `data` points into the `Box<AbortFlags>` owned by this `OpenContext`, which is
        // dropped after the llama.cpp context (field order), so it outlives every call
        // llama.cpp makes with it; `poll_abort` has the signature llama.cpp expects.
        self.with_mut(|context| unsafe { context.set_abort_callback(Some(abort::poll_abort), data) });
    }

    fn detach_pools(&mut self) {
        if !self.pools.is_empty() {
            self.with_mut(|context| context.detach_threadpool());
            self.pools.clear();
        }
    }

    /// `RpcError` once a server of the model has failed: its part of the model and of this
    /// context's cache is gone, and what ggml-rpc computed since is void.
    pub fn check_rpc(&self) -> Result<()> {
        self.rpc.as_ref().map_or(Ok(()), |links| links.check())
    }

    pub fn with<T>(&self, read: impl for<'a> FnOnce(&LlamaContext<'a>) -> T) -> T {
        self.cell.with_dependent(|_, context| read(context))
    }

    pub fn with_mut<T>(&mut self, write: impl for<'a> FnOnce(&mut LlamaContext<'a>) -> T) -> T {
        self.cell.with_dependent_mut(|_, context| write(context))
    }
}

/// A llama.cpp context: KV cache, compute buffers and outputs of one model.
///
/// Every method takes the context's lock with the GIL released, so threads sharing a context
/// are serialised and other Python threads keep running meanwhile.
#[pyclass(frozen, module = "llamactx", name = "LlamaContext")]
pub struct PyLlamaContext {
    native: OwnedMutex<Option<OpenContext>>,
    model: Py<PyLlamaModel>,
}

impl PyLlamaContext {
    pub fn create(model: &Bound<'_, PyLlamaModel>, options: ContextOptions) -> PyResult<Self> {
        let native_model = model.get().native()?;
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

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> std::result::Result<(), PyTraverseError> {
        visit.call(&self.model)?;
        // Never wait here: the collector runs with the GIL held, which a decode may need.
        if let Ok(Some(guard)) = self.native.try_lock() {
            if let Some(native) = guard.as_ref() {
                native.abort_flags.traverse(&visit)?;
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

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: &Bound<'_, PyAny>,
        _exc: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.close(py)
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
