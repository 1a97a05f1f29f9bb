//! The engine: one context and a scheduler thread that serves many requests at once
//! (continuous batching). Python (through the extension) or Rust submits token ids
//! and reads pieces; scheduling, decoding and sampling run on the engine's own thread, without
//! the GIL. The same scheduler runs on a caller's context in `context_loop.rs`.

pub mod backend;
pub mod draft;
pub mod draft_cost;
pub mod draft_model;
pub mod llama_backend;
pub mod logprobs;
pub mod media_prompt;
pub mod ngram;
pub mod plan;
pub mod prefix_cache;
pub mod request;
pub mod scheduler;
#[cfg(test)]
pub mod scripted;
pub mod slots;
pub mod stats;
pub mod wake_pipe;

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use llama_cpp_4::model::LlamaModel;

use crate::batch::BatchState;
use crate::errors::{Error, ExcClass, Result};
use crate::lora::LoraAdapter;
use crate::media::SharedMtmd;
use crate::open_context::adapters::check_scale;
use crate::open_context::{ContextOptions, OpenContext};
use crate::prompt_checks;
use crate::sampler::params::SamplingParams;
use crate::sampler::{guidance, SendSampler};
use crate::tokens::check_vocab;
use draft::{draft_options, Speculation};
pub use draft::{DraftChoice, NgramConfig};
use llama_backend::LlamaBackend;
pub use media_prompt::MediaInput;
use media_prompt::{check_projector, with_media};
pub use request::{Completion, RequestShared};
use scheduler::{Choosing, Job, Scheduler};
use slots::SlotChore;
pub use stats::EngineStats;

/// Requests that wait for a sequence slot, chores on slots, and whether the engine is closing.
#[derive(Default)]
struct Inbox {
    waiting: VecDeque<Job>,
    chores: VecDeque<SlotChore>,
    closed: bool,
}

/// What `stats()` reports. The scheduler owns the counting copy and publishes it to
/// `EngineShared` after each step.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    running: usize,
    kv_cells_used: usize,
    kv_cells_cached: usize,
    prefix_cache_hits: u64,
    tokens_generated: u64,
    prompt_tokens_computed: u64,
    drafted_tokens: u64,
    accepted_tokens: u64,
    busy_seconds: f64,
}

pub struct EngineShared {
    inbox: Mutex<Inbox>,
    /// Signalled when the inbox changes or a request is cancelled.
    wake: Condvar,
    counters: Mutex<Counters>,
}

impl EngineShared {
    /// Shared state for a scheduler that has yet to start.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            inbox: Mutex::default(),
            wake: Condvar::new(),
            counters: Mutex::default(),
        })
    }

    fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn counters(&self) -> MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `job` for the scheduler, whatever waits already (a loop on a caller's context
    /// serves only its caller's requests).
    pub fn enqueue(&self, job: Job) {
        self.inbox().waiting.push_back(job);
    }

    /// Wakes the scheduler if it sleeps (taking the lock it sleeps under, so no wake-up is lost).
    pub fn wake_scheduler(&self) {
        drop(self.inbox());
        self.wake.notify_all();
    }
}

/// The sizes requests are checked against at submit.
#[derive(Debug, Clone, Copy)]
struct Limits {
    n_vocab: i32,
    /// Cells one sequence may use.
    n_ctx_seq: usize,
    max_waiting: usize,
}

/// The engine: the API for Rust programs, and the one `llamactx.Engine` wraps
/// (`python.rs`).
pub struct Engine {
    shared: Arc<EngineShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    limits: Limits,
    /// For building grammars at submit (refused there if they do not parse).
    model: Arc<LlamaModel>,
    n_ctx: u32,
    n_seq_max: u32,
    /// The process the engine thread runs in: a forked child has none of it.
    pid: u32,
    /// The projector of prompts with images, which they are encoded by at submit.
    mtmd: Option<Arc<SharedMtmd>>,
    /// Whether the engine drafts (prompts with images are not drafted for).
    drafts: bool,
    /// The scale of the engine's LoRA adapter for requests that name none (None: no adapter).
    lora_scale: Option<Mutex<f32>>,
}

/// Why an engine from before a fork cannot be used.
const FORKED: &str =
    "this Engine was started in the parent of this forked process, where its thread stays; make a new one here";

/// What an engine is started with, beside its model and context options.
pub struct EngineSettings {
    /// Requests that may wait for a sequence; more are refused with `EngineBusy`.
    pub max_waiting: usize,
    /// Whether a request reuses the KV cells of an earlier one's prompt.
    pub prefix_cache: bool,
    /// Where drafts come from, and whether only where they pay (`only_where_faster`).
    pub drafting: Option<(DraftChoice, bool)>,
    /// The projector of prompts with images: they are encoded with it at submit, and its
    /// steps decode their embeddings.
    pub projector: Option<Arc<SharedMtmd>>,
    /// A LoRA adapter, and its scale for requests that name none.
    pub lora: Option<(Arc<LoraAdapter>, f32)>,
}

impl Default for EngineSettings {
    /// `llamactx.Engine`'s defaults: 1024 waiting requests, the prefix cache, no drafts,
    /// media or adapter.
    fn default() -> Self {
        Self {
            max_waiting: 1024,
            prefix_cache: true,
            drafting: None,
            projector: None,
            lora: None,
        }
    }
}

/// One request, as `Engine::submit` takes it.
pub struct Submission {
    /// The prompt's text tokens.
    pub tokens: Vec<i32>,
    /// Media chunks from the engine's projector, each to go before text token `at`.
    pub media: Vec<MediaInput>,
    pub max_tokens: usize,
    /// Strings that end the request where they appear (excluded from its text).
    pub stop: Vec<String>,
    pub sampling: SamplingParams,
    /// What holds the text to a grammar, if anything.
    pub constraint: Option<Constraint>,
    /// How many of the most likely tokens' log-probabilities to report per token (0: none).
    pub logprobs: usize,
    /// The scale of the engine's LoRA adapter (None: the engine's own).
    pub lora_scale: Option<f32>,
}

/// What holds a request's text to a grammar.
pub enum Constraint {
    /// A sampler that constrains (a copy of a prepared one).
    Sampler(SendSampler),
    /// llguidance's `kind` of grammar ("json", "lark", "regex"...) from `text`, built at submit.
    Grammar { kind: String, text: String },
}

impl Engine {
    /// Starts an engine (its context opened with `options`, its thread serving requests until
    /// `stop`) on `model`, which reads learned position embeddings if `learned_positions`
    /// (they bound `n_ctx`).
    ///
    /// # Errors
    ///
    /// `Error::Value` for options or a model an engine cannot serve (embeddings, an encoder, a
    /// projector of another model); the context's errors when llama.cpp cannot make it.
    pub fn start(
        model: Arc<LlamaModel>,
        learned_positions: bool,
        options: &ContextOptions,
        settings: EngineSettings,
    ) -> Result<Self> {
        if options.embeddings == Some(true) {
            return Err(Error::value(
                "an engine generates text: embeddings=True is for LlamaContext",
            ));
        }
        if model.has_encoder() {
            // The scheduler only decodes; llama.cpp's decoder of an encoder-decoder model
            // needs an encode first.
            return Err(Error::value(
                "an engine runs decoder-only models; this model has an encoder (T5-style)",
            ));
        }
        if let Some(projector) = &settings.projector {
            check_projector(projector, &model)?;
        }
        let lora_scale = settings.lora.as_ref().map(|(_, scale)| *scale);
        let mut native = OpenContext::open(Arc::clone(&model), options, learned_positions)?;
        // Generation keeps each sequence in the KV cache between steps.
        native.require_memory()?;
        if let Some((adapter, scale)) = settings.lora {
            native.set_lora(adapter, scale)?;
        }
        let threads = (options.n_threads, options.n_threads_batch);
        let speculation = settings
            .drafting
            .map(|(choice, gated)| {
                let source = choice.open(&model, &draft_options(&native, threads, options.flash_attn_type))?;
                Ok::<_, Error>(Speculation { source, gated })
            })
            .transpose()?;
        let drafts = speculation.is_some();
        let (n_ctx, n_seq_max) = native.with(|context| (context.n_ctx(), context.n_seq_max()));
        let limits = Limits {
            n_vocab: native.model().n_vocab(),
            n_ctx_seq: native.positions_per_sequence() as usize,
            max_waiting: settings.max_waiting,
        };
        let shared = EngineShared::new();
        let batch = BatchState::new(native.with(|context| context.n_batch()) as usize, 1)?;
        let scheduled = Arc::clone(&shared);
        let backend = LlamaBackend::new(native, batch, settings.projector.clone(), lora_scale)?;
        let prefix_cache = settings.prefix_cache;
        let thread = std::thread::Builder::new()
            .name("llamactx-engine".to_owned())
            .spawn(move || Scheduler::new(backend, scheduled, prefix_cache, speculation).run())
            .map_err(|err| Error::Runtime(format!("could not start the engine thread: {err}")))?;
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
            limits,
            model,
            n_ctx,
            n_seq_max,
            pid: std::process::id(),
            mtmd: settings.projector,
            drafts,
            lora_scale: lora_scale.map(Mutex::new),
        })
    }

    /// Queues a request for the prompt `tokens` (`submit` for text only, with no constraint,
    /// log-probabilities or adapter scale of its own), generated with `sampling`. Its text comes
    /// through `RequestShared::next_text`.
    ///
    /// # Errors
    ///
    /// As `submit`: `Error::Value` for a prompt that can never run (empty, too long for a
    /// sequence, a token outside the vocabulary) or once the engine is stopped; `EngineBusy` when
    /// `max_waiting` requests already wait.
    pub fn submit_tokens(
        &self,
        tokens: &[i32],
        max_tokens: usize,
        stop: Vec<String>,
        sampling: SamplingParams,
    ) -> Result<Arc<RequestShared>> {
        self.submit(Submission {
            tokens: tokens.to_vec(),
            media: Vec::new(),
            max_tokens,
            stop,
            sampling,
            constraint: None,
            logprobs: 0,
            lora_scale: None,
        })
    }

    /// Refuses a prompt of `tokens` and `media` that can never run, or `sampling` outside the
    /// vocabulary.
    fn refuse_shape(&self, tokens: &[i32], media: &[MediaInput], sampling: &SamplingParams) -> Result<()> {
        prompt_checks::prompt(
            media_prompt::shape(tokens.len(), media, self.drafts),
            self.limits.n_ctx_seq,
        )?;
        check_vocab(tokens, self.limits.n_vocab)?;
        sampling.check_vocabulary(self.limits.n_vocab)
    }

    /// Queues `submission`, checked before its media are encoded or its grammar built: its
    /// cells (each image's counted from its chunks) must fit a sequence, its tokens and
    /// biases the vocabulary.
    ///
    /// # Errors
    ///
    /// `Error::Value` for a request that can never run, a scale without an adapter, media
    /// without the engine's projector, or once the engine is stopped (or was started in the
    /// parent of a forked process); `SchemaError` for a constraint llguidance cannot compile;
    /// `EngineBusy` when `max_waiting` requests already wait.
    pub fn submit(&self, submission: Submission) -> Result<Arc<RequestShared>> {
        let Submission {
            tokens,
            media,
            max_tokens,
            stop,
            sampling,
            constraint,
            logprobs,
            lora_scale,
        } = submission;
        let lora_scale = self.request_scale(lora_scale)?;
        if logprobs > logprobs::MAX_TOP {
            return Err(Error::value(format!(
                "logprobs must be in 0..={}, got {logprobs}",
                logprobs::MAX_TOP
            )));
        }
        if std::process::id() != self.pid {
            return Err(Error::value(FORKED));
        }
        self.refuse_shape(&tokens, &media, &sampling)?;
        let prompt = with_media(self.mtmd.as_deref(), &self.model, tokens, &media)?;
        let grammar = match constraint {
            Some(Constraint::Sampler(sampler)) => Some(sampler),
            Some(Constraint::Grammar { kind, text }) => Some(SendSampler(guidance::new(&self.model, &kind, &text)?)),
            None => None,
        };
        self.queue(Job {
            request: Arc::new(RequestShared::new(Arc::clone(&self.shared))),
            prompt: prompt.tokens,
            max_tokens,
            stop,
            choosing: Choosing::Params(sampling, grammar),
            logprobs,
            submitted: Instant::now(),
            media: prompt.media,
            lora_scale,
            held: None,
        })
    }

    /// The adapter scale a request asking for `scale` is generated with.
    fn request_scale(&self, scale: Option<f32>) -> Result<Option<f32>> {
        match (&self.lora_scale, scale) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(Error::value("this engine has no LoRA adapter to scale")),
            (Some(_), Some(scale)) => check_scale(scale).map(Some),
            (Some(default), None) => Ok(Some(*default.lock().map_err(|_| Error::Poisoned("Engine"))?)),
        }
    }

    /// Queues `job`: `ValueError` once closed, `EngineBusy` when `max_waiting` requests
    /// already wait.
    fn queue(&self, job: Job) -> Result<Arc<RequestShared>> {
        let request = Arc::clone(&job.request);
        {
            let mut inbox = self.shared.inbox();
            if inbox.closed {
                return Err(Error::closed("Engine"));
            }
            if inbox.waiting.len() >= self.limits.max_waiting {
                return Err(Error::llama(
                    ExcClass::EngineBusy,
                    "QueueFull",
                    None,
                    format!(
                        "{} requests already wait for the engine (max_waiting); retry later",
                        inbox.waiting.len()
                    ),
                ));
            }
            inbox.waiting.push_back(job);
        }
        self.shared.wake.notify_all();
        Ok(request)
    }

    /// The model the engine runs.
    pub fn model(&self) -> &Arc<LlamaModel> {
        &self.model
    }

    /// Whether the engine thread has ended (or was never started in this process).
    pub fn thread_ended(&self) -> bool {
        std::process::id() != self.pid
            || self
                .thread
                .lock()
                .map_or(true, |thread| thread.as_ref().is_none_or(JoinHandle::is_finished))
    }

    /// The engine's counts now.
    pub fn stats(&self) -> EngineStats {
        let waiting = self.shared.inbox().waiting.len();
        let counters = *self.shared.counters();
        let tokens_per_second = if counters.busy_seconds > 0.0 {
            // A rate for display: the precision lost past 2**52 tokens does not matter.
            #[allow(clippy::cast_precision_loss)]
            let tokens = counters.tokens_generated as f64;
            tokens / counters.busy_seconds
        } else {
            0.0
        };
        EngineStats {
            running: counters.running,
            waiting,
            kv_cells_used: counters.kv_cells_used,
            kv_cells_cached: counters.kv_cells_cached,
            kv_cells_total: self.n_ctx,
            n_seq_max: self.n_seq_max,
            prefix_cache_hits: counters.prefix_cache_hits,
            tokens_generated: counters.tokens_generated,
            prompt_tokens_computed: counters.prompt_tokens_computed,
            drafted_tokens: counters.drafted_tokens,
            accepted_tokens: counters.accepted_tokens,
            tokens_per_second,
        }
    }

    /// KV cells of one sequence (`n_ctx / n_seq_max`): a prompt must be shorter.
    pub fn n_ctx_seq(&self) -> usize {
        self.limits.n_ctx_seq
    }

    /// Whether `stop()` was called.
    pub fn closed(&self) -> bool {
        self.shared.inbox().closed
    }

    /// The scale of the engine's LoRA adapter for requests that name none (None without an
    /// adapter).
    ///
    /// # Errors
    ///
    /// `Error::Poisoned` if a thread panicked while setting it.
    pub fn lora_scale(&self) -> Result<Option<f32>> {
        self.request_scale(None)
    }

    /// Sets the scale of the engine's LoRA adapter for the requests submitted from now on that
    /// name none.
    ///
    /// # Errors
    ///
    /// `Error::Value` without an adapter, or for a scale that is not finite.
    pub fn set_lora_scale(&self, scale: f32) -> Result<()> {
        let Some(default) = &self.lora_scale else {
            return Err(Error::value("this engine has no LoRA adapter to scale"));
        };
        *default.lock().map_err(|_| Error::Poisoned("Engine"))? = check_scale(scale)?;
        Ok(())
    }

    /// Stops the engine: requests still waiting or running end as "cancelled"; returns once
    /// the engine thread has ended (after the step it is computing).
    ///
    /// # Errors
    ///
    /// `Error::Panic` if the engine thread panicked.
    pub fn stop(&self) -> Result<()> {
        if std::process::id() != self.pid {
            // Joining a thread this process does not have would never return.
            return Ok(());
        }
        {
            let mut inbox = self.shared.inbox();
            inbox.closed = true;
        }
        self.shared.wake.notify_all();
        let thread = self.thread.lock().map_err(|_| Error::Poisoned("Engine"))?.take();
        if let Some(thread) = thread {
            thread
                .join()
                .map_err(|_| Error::Panic("the engine thread panicked".to_owned()))?;
        }
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The engine thread never needs the GIL, so waiting for it here cannot deadlock.
        let _ = self.stop();
    }
}
