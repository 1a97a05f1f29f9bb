//! The context at the core: the crate's `LlamaContext<'model>` kept beside the `Arc` of its
//! model, with the bookkeeping that makes every call on it safe (`LlamaContext` in Python,
//! `context.rs`, holds one behind a lock). The methods live by theme in the submodules.

pub mod abort;
pub mod adapters;
pub mod compute;
pub mod kv;
pub mod media;
pub mod memory_budget;
pub mod outputs;
pub mod params;
pub mod rollback;
pub mod state;
pub mod state_layout;

use std::collections::BTreeMap;
use std::sync::Arc;

use llama_cpp_4::context::LlamaContext;
use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::sampling::LlamaSampler;
use self_cell::self_cell;

use crate::backend::{backend, explained};
use crate::errors::Result;
use crate::lora::AdapterLease;
use crate::rpc::{self, ModelLinks};
use crate::threadpool::PoolLease;
use abort::AbortFlags;
pub use params::ContextOptions;

self_cell!(
    /// The native context, borrowing the model it owns an `Arc` of.
    pub struct ContextCell {
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
    pub cell: ContextCell,
    pub abort_flags: Box<AbortFlags>,
    /// Copies given to `llama_set_sampler`, by sequence.
    pub backend_samplers: BTreeMap<i32, LlamaSampler>,
    pub lora: Option<AdapterLease>,
    pub pools: Vec<PoolLease>,
    /// Batch indices of the rows that hold outputs (logits, embeddings) now. The crate keeps
    /// the same list privately and panics on a row outside it [llama.cpp internal]; ours is
    /// also emptied when a state restore leaves llama.cpp without outputs, which the crate
    /// does not track.
    pub output_rows: Vec<i32>,
    /// Sequences of the last successful batch (their pooled embeddings are current).
    pub output_seqs: Vec<i32>,
    pub n_vocab: i32,
    pub n_seq_max: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub embeddings: bool,
    pub causal_attn: bool,
    pub has_encoder: bool,
    /// An encoder-decoder model whose decoder has no encoder output to attend to yet: llama.cpp
    /// asserts on such a decode. Only a successful `encode` provides one; a state restore does
    /// not carry it.
    pub awaits_encoder: bool,
    /// One KV stream for all sequences (`kv_unified=True`) instead of one per sequence.
    pub kv_unified: bool,
    /// False for a K cache type the CPU cannot RoPE-shift (see `can_shift`).
    pub k_cache_shifts: bool,
    /// False for models without a KV cache (BERT-style): llama.cpp's memory calls would
    /// dereference null.
    pub has_memory: bool,
    /// The RPC servers of its model, whose failure makes every later call an `RpcError`.
    pub rpc: Option<Arc<ModelLinks>>,
    /// For a model with learned position embeddings, how many positions they hold: llama.cpp
    /// pads `n_ctx` to a multiple of 256 and reads the table's row for each position
    /// (`GGML_ASSERT` past it), so no batch may reach past them.
    pub position_limit: Option<i32>,
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
    pub fn register_abort_flags(&mut self) {
        let data = std::ptr::from_ref::<AbortFlags>(&self.abort_flags)
            .cast_mut()
            .cast::<std::ffi::c_void>();
        // SAFETY: `data` points into the `Box<AbortFlags>` owned by this `OpenContext`, which is
        // dropped after the llama.cpp context (field order), so it outlives every call
        // llama.cpp makes with it; `poll_abort` has the signature llama.cpp expects.
        self.with_mut(|context| unsafe { context.set_abort_callback(Some(abort::poll_abort), data) });
    }

    pub fn detach_pools(&mut self) {
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
