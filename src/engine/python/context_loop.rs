//! The engine's step loop on a caller's `LlamaContext`: `continue_sequence` (and so `stream`,
//! `generate` and `chat`), `ChatSession`'s turns and `generate_batch` run their sequences
//! through the scheduler the engine runs, a step per call in the caller's thread. Prompts are
//! batched, their media placed, their cached starts reused, drafts verified and sequences ended
//! by the engine's code; between steps the caller may use its context.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use llama_cpp_4::model::LlamaModel;
use pyo3::prelude::*;

use super::speculative_options::SpeculativeOptions;
use crate::batch::BatchState;
use crate::context::{OpenContext, PyLlamaContext};
use crate::engine::backend::Backend;
use crate::engine::draft::{draft_options, Speculation};
use crate::engine::llama_backend::{LlamaBackend, Native};
use crate::engine::media_prompt::{self, check_projector, with_media};
use crate::engine::request::python::PyRequestCore;
use crate::engine::request::RequestShared;
use crate::engine::scheduler::{Choosing, Ended, Held, Holds, Job, Scheduler};
use crate::engine::EngineShared;
use crate::errors::python::to_py;
use crate::errors::{Error, Result};
use crate::gil::detached;
use crate::media::python::{PyMtmdContext, PyMtmdInputChunks};
use crate::media::SharedMtmd;
use crate::prompt_checks;
use crate::sampler::python::PyLlamaSampler;
use crate::tokens::{check_vocab, to_llama_tokens};

/// A caller's context, locked for each call: between steps the caller may use it too.
struct CallerContext(Py<PyLlamaContext>);

impl Native for CallerContext {
    fn open<T>(&self, work: impl FnOnce(&OpenContext) -> Result<T>) -> Result<T> {
        self.0.get().with_open(|native| work(native))
    }

    fn open_mut<T>(&mut self, work: impl FnOnce(&mut OpenContext) -> Result<T>) -> Result<T> {
        self.0.get().with_open(work)
    }
}

type CallerScheduler = Scheduler<LlamaBackend<CallerContext>>;

/// The scheduler, behind the loop's lock.
struct Stepping(CallerScheduler);

// SAFETY: the scheduler's samplers and draft context are `!Send` only because they own raw
// pointers to llama.cpp objects, which have no thread affinity; they are reached through the
// `Mutex` in `PyContextLoop` only, so by one thread at a time (as the engine's scheduler is
// by its thread). The caller's context is locked for each call the backend makes.
unsafe impl Send for Stepping {}

/// The engine's scheduler on sequences `seqs` of a caller's context (generation on a caller's
/// context: `continue_sequence` and `generate_batch` hold one each).
#[pyclass(frozen, module = "llamactx", name = "_ContextLoop")]
pub struct PyContextLoop {
    stepping: Mutex<Stepping>,
    shared: Arc<EngineShared>,
    model: Arc<LlamaModel>,
    n_vocab: i32,
    /// The positions one sequence holds.
    n_ctx_seq: usize,
    /// The projector of prompts with media.
    mtmd: Option<Arc<SharedMtmd>>,
    /// Whether requests draft (their prompts are then read by the drafts too).
    drafts: bool,
    /// What the last held request left in its sequence, from position 0.
    held: Arc<Mutex<Vec<i32>>>,
}

impl PyContextLoop {
    fn queue(&self, job: Job) -> PyRequestCore {
        let request = Arc::clone(&job.request);
        self.shared.enqueue(job);
        PyRequestCore { shared: request }
    }
}

#[pymethods]
impl PyContextLoop {
    /// Serves sequences `seqs` of `ctx` (the others stay the caller's), drafting as
    /// `speculative` asks (an `NgramDraft` or a `DraftModel`, whose context takes `ctx`'s
    /// sizes and threads); with `prefix_cache`, a request reuses the cells a finished one (or
    /// `adopt`) left in a sequence, as the engine's do. `mtmd` (a projector of `ctx`'s model)
    /// reads the prompts' media.
    #[new]
    #[pyo3(signature = (ctx, seqs, speculative=None, prefix_cache=false, mtmd=None))]
    fn new(
        py: Python<'_>,
        ctx: &Bound<'_, PyLlamaContext>,
        seqs: Vec<i32>,
        speculative: Option<&Bound<'_, PyAny>>,
        prefix_cache: bool,
        mtmd: Option<&Bound<'_, PyMtmdContext>>,
    ) -> PyResult<Self> {
        let speculative = speculative.map(SpeculativeOptions::read).transpose()?;
        let mtmd = mtmd.map(|mtmd| Arc::clone(&mtmd.get().shared));
        let context = ctx.clone().unbind();
        let (backend, model, speculation) = detached(py, || {
            let (model, n_seq_max, options) = context.get().with_open(|native| {
                let (n_seq_max, threads) =
                    native.with(|context| (context.n_seq_max(), (context.n_threads(), context.n_threads_batch())));
                let options = draft_options(native, (Some(threads.0), Some(threads.1)), None);
                Ok((Arc::clone(native.model()), n_seq_max, options))
            })?;
            if let Some(seq) = seqs
                .iter()
                .find(|&&seq| u32::try_from(seq).map_or(true, |seq| seq >= n_seq_max))
            {
                return Err(Error::value(format!(
                    "seq_id {seq} is outside the context's {n_seq_max} sequences (n_seq_max)"
                )));
            }
            if let Some(mtmd) = &mtmd {
                check_projector(mtmd, &model)?;
            }
            let speculation = match speculative {
                Some(speculative) => {
                    let gated = speculative.gated;
                    Some(Speculation {
                        source: speculative.choice(&model)?.open(&model, &options)?,
                        gated,
                    })
                }
                None => None,
            };
            let n_batch = options.n_batch.map_or(1, |n_batch| n_batch as usize);
            let backend = LlamaBackend::new(CallerContext(context), BatchState::new(n_batch, 1)?, mtmd.clone(), None)?;
            Ok((backend, model, speculation))
        })?;
        let n_ctx_seq = backend.sizes().n_ctx_seq;
        let n_vocab = model.n_vocab();
        let drafts = speculation.is_some();
        let shared = EngineShared::new();
        let scheduler = Scheduler::new(backend, Arc::clone(&shared), prefix_cache, speculation).on_sequences(&seqs);
        Ok(Self {
            stepping: Mutex::new(Stepping(scheduler)),
            shared,
            model,
            n_vocab,
            n_ctx_seq,
            mtmd,
            drafts,
            held: Arc::default(),
        })
    }

    /// Queues a request for `tokens`, with each of `media` (`(at, chunks)` of the loop's
    /// projector) spliced in before text token `at`, choosing its tokens with a copy of
    /// `sampler`'s state. With `held_seq`, the request runs on that sequence: when it ends,
    /// `sampler` takes the copy's state and `held()` what the sequence holds. The sequence holds
    /// `holds` (what `held()` said after an earlier request: the prompt reads only what follows
    /// the start they share), or, when `holds` is None, all of `tokens`, the last with logits
    /// in the context's last decode: the request then samples from there and must be the only
    /// one of the loop.
    #[pyo3(signature = (tokens, max_tokens, stop, sampler, held_seq=None, holds=None, media=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        py: Python<'_>,
        tokens: Vec<i32>,
        max_tokens: i64,
        stop: Vec<String>,
        sampler: &Bound<'_, PyLlamaSampler>,
        held_seq: Option<i32>,
        holds: Option<Vec<i32>>,
        media: Vec<(usize, Bound<'_, PyMtmdInputChunks>)>,
    ) -> PyResult<PyRequestCore> {
        let max_tokens = prompt_checks::max_tokens(max_tokens).map_err(to_py)?;
        let media: Vec<_> = media.iter().map(|(at, chunks)| chunks.get().input_at(*at)).collect();
        if !media.is_empty() {
            prompt_checks::prompt(media_prompt::shape(tokens.len(), &media, self.drafts), self.n_ctx_seq)
                .map_err(to_py)?;
        }
        if held_seq.is_none() && holds.is_some() {
            return Err(to_py(Error::value(
                "holds= tells what the sequence held_seq= holds, and no held_seq= was given",
            )));
        }
        let holds = holds.map_or(Holds::Prompt, |tokens| Holds::Tokens(to_llama_tokens(&tokens)));
        // A prompt held whole is never decoded again, except by drafts.
        if held_seq.is_none() || !matches!(holds, Holds::Prompt) || self.drafts {
            check_vocab(&tokens, self.n_vocab).map_err(to_py)?;
        }
        let prompt = detached(py, || with_media(self.mtmd.as_deref(), &self.model, tokens, &media))?;
        let copy = sampler.get().copy_for(py, &self.model)?;
        let held = held_seq.map(|seq| {
            let home = sampler.clone().unbind();
            let held = Arc::clone(&self.held);
            Held {
                seq,
                holds,
                on_end: Box::new(move |ended: Ended| {
                    home.get().take_state(ended.sampler, ended.refused);
                    if let Ok(mut slot) = held.lock() {
                        *slot = ended.tokens.iter().map(|token| token.0).collect();
                    }
                }),
            }
        });
        let job = Job {
            request: Arc::new(RequestShared::new(Arc::clone(&self.shared))),
            prompt: prompt.tokens,
            max_tokens,
            stop,
            choosing: Choosing::Sampler(copy),
            logprobs: 0,
            submitted: Instant::now(),
            media: prompt.media,
            lora_scale: None,
            held,
        };
        Ok(self.queue(job))
    }

    /// Tells the prefix cache that free sequence `seq` holds `tokens` from position 0 (the
    /// caller read them there): `ValueError` for a sequence the loop does not serve, or one in
    /// use, or a loop without a prefix cache.
    fn adopt(&self, tokens: Vec<i32>, seq: i32) -> PyResult<()> {
        check_vocab(&tokens, self.n_vocab).map_err(to_py)?;
        let mut stepping = self
            .stepping
            .lock()
            .map_err(|_| to_py(Error::Poisoned("_ContextLoop")))?;
        if stepping.0.adopt(seq, to_llama_tokens(&tokens)) {
            Ok(())
        } else {
            Err(to_py(Error::value(format!(
                "sequence {seq} is not a free sequence of this loop's prefix cache"
            ))))
        }
    }

    /// Runs one step (without the GIL); whether requests are left.
    fn step(&self, py: Python<'_>) -> PyResult<bool> {
        detached(py, || {
            let mut stepping = self.stepping.lock().map_err(|_| Error::Poisoned("_ContextLoop"))?;
            Ok(stepping.0.step_now())
        })
    }

    /// What the last held request left in its sequence's KV cache, from position 0: its
    /// prompt (each image's positions as placeholder tokens, negative) and the tokens it
    /// generated (taken: a second call returns none).
    fn held(&self) -> PyResult<Vec<i32>> {
        let mut slot = self.held.lock().map_err(|_| to_py(Error::Poisoned("_ContextLoop")))?;
        Ok(std::mem::take(&mut *slot))
    }
}
