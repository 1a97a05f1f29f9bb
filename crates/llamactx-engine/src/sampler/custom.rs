//! Samplers written in Rust (lazy grammars, llguidance constraints), plugged into llama.cpp's
//! sampler chains through one C interface.
//!
//! llama.cpp's sampler interface returns nothing, so a failure inside one is recorded per
//! thread and collected by the caller (`take_failure`) after the call that could fail; no panic
//! ever unwinds into llama.cpp (that would abort the process).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use llama_cpp_4::sampling::LlamaSampler;
use llama_cpp_4::token::LlamaToken;
use llama_cpp_sys_4::{llama_sampler, llama_sampler_i, llama_token, llama_token_data_array};
use rayon::iter::{IntoParallelIterator, ParallelIterator};

use crate::errors::{Error, Result};

/// A sampler stage implemented in Rust.
pub trait RustSampler {
    /// The name llama.cpp reports for it.
    fn name(&self) -> &'static CStr;
    /// Takes the chosen `token` into its state.
    fn accept(&mut self, token: LlamaToken) -> Result<()>;
    /// Filters or reweighs `candidates` in place; a failure is `record`ed.
    fn apply(&mut self, candidates: &mut llama_token_data_array);
    /// Forgets what was accepted.
    fn reset(&mut self) -> Result<()>;
    /// An independent copy of its current state.
    fn copy(&self) -> Result<Box<dyn RustSampler>>;
    /// Does ahead of time, possibly on another thread, what its next `apply` needs; a failure
    /// is left for `apply` to meet and record.
    fn prepare(&mut self) {}
}

/// The first stage of a chain when it is a Rust sampler, as a pointer another thread may use.
struct RustStage(*mut llama_sampler);

// SAFETY: the stage is used by one thread at a time: `prepare_first_stages` hands each to one
// worker and waits for all of them before its caller touches the chains again.
unsafe impl Send for RustStage {}

/// Lets the Rust first stages of `chains` (the constraints the engine puts first) prepare
/// their next `apply` in parallel: llguidance's masks of a batch's sequences, computed at once.
pub fn prepare_first_stages<'a>(chains: impl Iterator<Item = &'a mut LlamaSampler>) {
    let stages: Vec<RustStage> = chains.filter_map(first_rust_stage).collect();
    if stages.len() < 2 {
        return; // `apply` computes a lone mask as soon
    }
    stages.into_par_iter().for_each(|stage| {
        // SAFETY: `first_rust_stage` checked that the stage is ours and alive (its chain is
        // borrowed mutably for this call), and no other thread has it.
        let sampler = unsafe { rust(stage.0) };
        let _ = catch_unwind(AssertUnwindSafe(|| sampler.prepare()));
    });
}

fn first_rust_stage(chain: &mut LlamaSampler) -> Option<RustStage> {
    if chain.name() != "chain" || chain.chain_n() < 1 {
        return None;
    }
    // SAFETY: `chain` is a chain with a first stage, which it owns and keeps while borrowed.
    let first = unsafe { chain.chain_get_ptr(0) };
    // SAFETY: a chain's stages are live samplers; only ours have `INTERFACE` as their interface.
    let ours = !first.is_null() && std::ptr::eq(unsafe { (*first).iface }, &raw const INTERFACE);
    ours.then_some(RustStage(first))
}

thread_local! {
    /// Why the last call into a Rust sampler on this thread failed.
    static FAILURE: RefCell<Option<Error>> = const { RefCell::new(None) };
}

/// Records why a Rust sampler failed, for the caller's `take_failure`.
pub fn record(err: Error) {
    FAILURE.with(|failure| *failure.borrow_mut() = Some(err));
}

/// The failure a Rust sampler recorded on this thread since the last call, if any.
pub fn take_failure() -> Option<Error> {
    FAILURE.with(|failure| failure.borrow_mut().take())
}

/// The candidates of a llama.cpp array, as a slice.
pub fn candidates_of(candidates: &mut llama_token_data_array) -> &mut [llama_cpp_sys_4::llama_token_data] {
    if candidates.data.is_null() || candidates.size == 0 {
        return &mut [];
    }
    // SAFETY: `data` points to `size` candidates that llama.cpp lends for the call the array
    // was passed to, which outlives the returned borrow of it.
    unsafe { std::slice::from_raw_parts_mut(candidates.data, candidates.size) }
}

/// A llama.cpp sampler running `sampler`.
pub fn into_sampler(sampler: Box<dyn RustSampler>) -> LlamaSampler {
    // SAFETY: INTERFACE is a static that llama.cpp only reads; the context is a live boxed
    // sampler that `free` (below) turns back into its Box exactly once.
    unsafe { LlamaSampler::from_raw((&raw const INTERFACE).cast_mut(), boxed(sampler)) }
}

fn boxed(sampler: Box<dyn RustSampler>) -> *mut c_void {
    Box::into_raw(Box::new(sampler)).cast()
}

/// The Rust sampler behind a sampler built by `into_sampler`.
///
/// # Safety
/// `sampler` must come from `into_sampler` or `clone`, be alive, and not be used by another
/// thread.
unsafe fn rust<'a>(sampler: *const llama_sampler) -> &'a mut Box<dyn RustSampler> {
    // SAFETY: per the contract, `ctx` is the box `boxed` leaked.
    unsafe { &mut *(*sampler).ctx.cast::<Box<dyn RustSampler>>() }
}

/// Runs `body`, recording a panic as a failure instead of unwinding into llama.cpp.
fn guarded(body: impl FnOnce() -> Result<()>) {
    let outcome =
        catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| Err(Error::Panic("a sampler panicked".to_owned())));
    if let Err(err) = outcome {
        record(err);
    }
}

unsafe extern "C" fn name(sampler: *const llama_sampler) -> *const c_char {
    // SAFETY: llama.cpp calls this on a sampler it got from `into_sampler`.
    unsafe { rust(sampler) }.name().as_ptr()
}

unsafe extern "C" fn accept(sampler: *mut llama_sampler, token: llama_token) {
    // SAFETY: llama.cpp calls this on a sampler it got from `into_sampler`.
    let sampler = unsafe { rust(sampler) };
    guarded(|| sampler.accept(LlamaToken::new(token)));
}

unsafe extern "C" fn apply(sampler: *mut llama_sampler, candidates: *mut llama_token_data_array) {
    // SAFETY: llama.cpp calls this on a sampler it got from `into_sampler`, with its live array.
    let (sampler, candidates) = unsafe { (rust(sampler), &mut *candidates) };
    let applied = catch_unwind(AssertUnwindSafe(|| sampler.apply(candidates)));
    if applied.is_err() {
        // Nothing unfiltered may be sampled after a failed filter.
        record(Error::Panic("a sampler panicked".to_owned()));
        for candidate in candidates_of(candidates) {
            candidate.logit = f32::NEG_INFINITY;
        }
    }
}

unsafe extern "C" fn reset(sampler: *mut llama_sampler) {
    // SAFETY: llama.cpp calls this on a sampler it got from `into_sampler`.
    let sampler = unsafe { rust(sampler) };
    guarded(|| sampler.reset());
}

unsafe extern "C" fn clone(sampler: *const llama_sampler) -> *mut llama_sampler {
    // SAFETY: llama.cpp calls this on a sampler it got from `into_sampler`.
    let sampler = unsafe { rust(sampler) };
    let copy = catch_unwind(AssertUnwindSafe(|| sampler.copy()));
    match copy {
        // SAFETY: as in `into_sampler`; llama.cpp owns the copy and frees it through `free`.
        Ok(Ok(copy)) => unsafe { llama_cpp_sys_4::llama_sampler_init((&raw const INTERFACE).cast_mut(), boxed(copy)) },
        Ok(Err(err)) => {
            record(err);
            std::ptr::null_mut()
        }
        Err(_) => {
            record(Error::Panic("a sampler panicked".to_owned()));
            std::ptr::null_mut()
        }
    }
}

unsafe extern "C" fn free(sampler: *mut llama_sampler) {
    // SAFETY: llama.cpp frees each sampler once; `ctx` is the box `boxed` leaked.
    drop(unsafe { Box::from_raw((*sampler).ctx.cast::<Box<dyn RustSampler>>()) });
}

static INTERFACE: llama_sampler_i = llama_sampler_i {
    name: Some(name),
    accept: Some(accept),
    apply: Some(apply),
    reset: Some(reset),
    clone: Some(clone),
    free: Some(free),
    backend_init: None,
    backend_accept: None,
    backend_apply: None,
    backend_set_input: None,
    backend_reset: None,
    copy_state: None,
};
