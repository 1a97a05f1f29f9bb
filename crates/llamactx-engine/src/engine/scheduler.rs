//! The engine's thread. Each step decodes chunks of prompts in one batch (oldest request first,
//! up to `n_batch` tokens; requests that arrived meanwhile fill what room is left, in a second
//! batch), then the next token of every generating sequence in another: a long
//! prompt is read over several steps while the other sequences keep generating, and a request
//! whose prompt was read generates in the same step. Requests take
//! a free sequence slot when the KV cells they may need (prompt plus `max_tokens`, at most a
//! sequence's share) are free too, first come first served.
//!
//! What each decode holds is decided by `plan.rs` (admissions, prompt chunks, decode order) and
//! `prefix_cache.rs` (which sequence a prompt starts in, and what it reuses), from each request's
//! `Phase`; this file acts on those decisions: it decodes, samples, emits and ends requests,
//! through a `Backend` (llama.cpp's context in the engine, a scripted model in `tests.rs`).
//! Drafting and the verification of drafts are in `speculation.rs`, media entries in
//! `media.rs`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_4::sampling::LlamaSampler;
use llama_cpp_4::token::LlamaToken;

use self::speculation::can_pay;
use super::backend::{Backend, Entry, Sizes};
use super::draft::{DraftLength, Speculation};
use super::draft_cost::DraftCosts;
use super::logprobs::top_logprobs;
use super::plan;
use super::prefix_cache::{shared_start, Adapter, Placement, PrefixCache};
use super::request::{Completion, RequestShared, TokenLogprobs};
use super::{Counters, EngineShared, Inbox};
use crate::backend::log_warning;
use crate::errors::{Error, Result};
use crate::media::SharedChunks;
use crate::sampler::custom::prepare_first_stages;
use crate::sampler::params::{GreedyPick, SamplingParams};
use crate::sampler::{no_token_left, refuse_unfinished_end, select_from, try_accept, SendSampler};
use crate::steps::{Finish, Steps};

/// A submitted request, checked against the engine's limits.
pub struct Job {
    pub request: Arc<RequestShared>,
    pub prompt: Vec<LlamaToken>,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub choosing: Choosing,
    /// Alternatives to report per generated token (0: no log-probabilities).
    pub logprobs: usize,
    pub submitted: Instant,
    /// The prompt's images, in order; each takes its positions in `prompt` with placeholder
    /// tokens (`media_prompt::placeholders`).
    pub media: Vec<MediaSpan>,
    /// The scale of the engine's LoRA adapter this request is generated with (None: the engine
    /// has no adapter).
    pub lora_scale: Option<f32>,
    /// The caller's sequence it runs on (generation on a caller's context), instead of one the
    /// prefix cache chooses.
    pub held: Option<Held>,
}

/// How a request chooses its tokens.
pub enum Choosing {
    /// `SamplingParams`, after a constraint's sampler (a GBNF grammar, a JSON Schema) if there
    /// is one.
    Params(SamplingParams, Option<SendSampler>),
    /// A caller's sampler, whole; the request's sequence samples with a copy of its state.
    Sampler(SendSampler),
}

impl Choosing {
    /// The sequence's sampler (a constraint is taken: called once, at admission).
    fn take_picker(&mut self, n_vocab: i32) -> Picker {
        let (chain, greedy) = match self {
            Self::Params(sampling, constraint) => {
                let built = sampling.build(n_vocab);
                match constraint.take() {
                    Some(constraint) => (LlamaSampler::chain([constraint.0, built], true), None),
                    None => (built, sampling.greedy_pick()),
                }
            }
            Self::Sampler(sampler) => (sampler.0.clone_sampler(), None),
        };
        Picker {
            chain,
            greedy,
            refused: false,
        }
    }
}

/// A request on a sequence of the caller's context, placed there as it is, its cells kept
/// when it ends.
pub struct Held {
    pub seq: i32,
    pub holds: Holds,
    /// Given the sequence's sampler and contents when it ends.
    pub on_end: Box<dyn FnOnce(Ended) + Send>,
}

/// What a held request's sequence holds when it is submitted.
pub enum Holds {
    /// The whole prompt, its last token with logits in the caller's last decode
    /// (`continue_sequence`): its first token is sampled from that output row
    /// (`Backend::last_row`), so it must be the only request that starts so.
    Prompt,
    /// These tokens from position 0 (what an earlier request left there: `ChatSession`'s
    /// turns): the prompt reuses the start it shares with them, as the prefix cache's requests
    /// do, and reads the rest; the cells after that start are cleared.
    Tokens(Vec<LlamaToken>),
}

/// What a held request leaves its caller.
pub struct Ended {
    /// The sampler's state after the last token, and whether it refused a token it chose (a
    /// grammar then cannot go on).
    pub sampler: LlamaSampler,
    pub refused: bool,
    /// What the sequence's KV cache holds from position 0: the prompt's tokens read (media
    /// placeholders included), then those generated.
    pub tokens: Vec<LlamaToken>,
}

/// An image (or audio clip) of a prompt, encoded at submit: its embeddings are decoded as a
/// step entry of their own, in a decode of their own.
pub struct MediaSpan {
    /// Where it starts in the prompt.
    pub at: usize,
    /// The positions it takes.
    pub width: usize,
    /// The KV cells its embeddings take: more than its positions where the model places
    /// several embeddings at a position (M-RoPE).
    pub cells: usize,
    pub chunks: Arc<SharedChunks>,
    pub index: usize,
    pub embeddings: Arc<Vec<f32>>,
}

impl Drop for Job {
    /// No request is left without an outcome, whatever ends the engine's work on it (the first
    /// outcome wins, so this does nothing to a request that ended normally).
    fn drop(&mut self) {
        self.request.fail(Error::Runtime(
            "the engine stopped serving this request (see the log)".to_owned(),
        ));
    }
}

impl Job {
    /// The image that starts at `position` of the prompt.
    fn media_at(&self, position: usize) -> Option<&MediaSpan> {
        self.media.iter().find(|span| span.at == position)
    }

    /// Where the text run of the prompt that goes on at `position` ends: at the next image,
    /// or at the prompt's end.
    fn text_end(&self, position: usize) -> usize {
        self.media
            .iter()
            .map(|span| span.at)
            .find(|&at| at >= position)
            .unwrap_or(self.prompt.len())
    }

    /// `reused` cached prompt tokens, moved back to the start of an image it would cut.
    fn whole_media(&self, reused: usize) -> usize {
        self.media
            .iter()
            .find(|span| span.at < reused && reused < span.at + span.width)
            .map_or(reused, |span| span.at)
    }

    /// What its cells are computed under.
    fn adapter(&self) -> Adapter {
        self.lora_scale.map(f32::to_bits)
    }

    /// The KV cells the request may come to use.
    fn cells(&self, n_ctx_seq: usize) -> usize {
        let beyond_positions: usize = self
            .media
            .iter()
            .map(|span| span.cells.saturating_sub(span.width))
            .sum();
        self.prompt
            .len()
            .saturating_add(self.max_tokens)
            .min(n_ctx_seq)
            .saturating_add(beyond_positions)
    }
}

/// Where a request holding a sequence stands.
enum Phase {
    /// Its prompt is being read (what is not in the KV cache yet).
    Reading,
    /// Its whole prompt was read by the caller: it samples from the caller's last output row.
    Ready,
    /// Its last sampled token is decoded next.
    Generating(LlamaToken),
    /// It ended; its sequence is freed at the end of the step.
    Ended(End),
}

impl Phase {
    fn is_live(&self) -> bool {
        !matches!(self, Self::Ended(_))
    }
}

/// How a running sequence ends.
enum End {
    Finished(Finish),
    Cancelled,
    Failed(Error),
}

/// How a running request picks its tokens.
struct Picker {
    chain: LlamaSampler,
    /// Picks in place of `chain` when that is plain greedy (with `logit_bias`).
    greedy: Option<GreedyPick>,
    /// Whether `chain` refused a token it chose (see `Ended`).
    refused: bool,
}

/// A request that holds a sequence slot.
struct Running {
    job: Job,
    seq: i32,
    picker: Picker,
    steps: Steps,
    /// The tokens of this sequence in the KV cache (the prompt is read while they are fewer),
    /// for the prefix cache.
    kv_tokens: Vec<LlamaToken>,
    /// Prompt tokens found in the KV cache at admission.
    reused: usize,
    phase: Phase,
    tokens: Vec<i32>,
    logprobs: TokenLogprobs,
    /// How many of `logprobs` went out with pieces.
    logprobs_sent: usize,
    text: String,
    sampled: usize,
    /// How many tokens its drafts propose, with speculation.
    draft_length: Option<DraftLength>,
    /// Drafted tokens verified, and how many of them were accepted.
    drafted: usize,
    accepted: usize,
    admitted: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// Steps it has waited for its adapter scale's turn (see `Scheduler::take_turn`).
    turns_waited: u32,
}

impl Running {
    /// Tokens of this sequence in the KV cache.
    fn kv_len(&self) -> usize {
        self.kv_tokens.len()
    }

    /// How many tokens to draft after its last sampled token: never past `max_tokens` (the
    /// request's reserved cells) nor past the token that fills the sequence's `n_ctx_seq`
    /// cells.
    fn draft_limit(&self, n_ctx_seq: usize) -> usize {
        let Some(length) = &self.draft_length else {
            return 0;
        };
        let left = self.job.max_tokens.saturating_sub(self.sampled + 1);
        let before_end = n_ctx_seq.saturating_sub(self.kv_tokens.len() + 2);
        length.wanted(left.min(before_end))
    }

    fn completion(&self, finish_reason: &'static str) -> Completion {
        let seconds = |from: Instant, to: Option<Instant>| to.map(|to| to.duration_since(from).as_secs_f64());
        let generating = match (self.first_token, self.last_token) {
            (Some(first), Some(last)) if self.sampled > 1 => last.duration_since(first).as_secs_f64(),
            _ => 0.0,
        };
        Completion {
            text: self.text.clone(),
            tokens: self.tokens.clone(),
            logprobs: self.logprobs.clone(),
            finish_reason,
            prompt_tokens: self.job.prompt.len(),
            cached_tokens: self.reused,
            completion_tokens: self.sampled,
            drafted_tokens: self.drafted,
            accepted_tokens: self.accepted,
            queue_seconds: self.admitted.duration_since(self.job.submitted).as_secs_f64(),
            first_token_seconds: seconds(self.job.submitted, self.first_token),
            tokens_per_second: if generating > 0.0 {
                f64::from(u32::try_from(self.sampled - 1).unwrap_or(u32::MAX)) / generating
            } else {
                0.0
            },
        }
    }
}

/// What a step's generation decode holds, decided before anything is drafted or decoded
/// (`Scheduler::plan_generation`, which changes nothing): logged when the decode fails.
#[derive(Debug, PartialEq)]
struct GenerationPlan {
    /// The generating requests (indices into `running`), in decode order.
    order: Vec<usize>,
    /// Whether this step drafts (speculation is on, and a draft can pay at this load).
    drafting: bool,
    /// Per request in `order`, the most tokens it may draft, sharing `n_batch`
    /// (`plan::draft_lengths`).
    draft_limits: Vec<usize>,
    /// The share of its drafted tokens a request must see accepted (None until measured).
    least_acceptance: Option<f64>,
}

/// A completion for a request that ended before it held a slot.
fn unstarted(job: &Job, finish_reason: &'static str) -> Completion {
    Completion {
        text: String::new(),
        tokens: Vec::new(),
        logprobs: Vec::new(),
        finish_reason,
        prompt_tokens: job.prompt.len(),
        cached_tokens: 0,
        completion_tokens: 0,
        drafted_tokens: 0,
        accepted_tokens: 0,
        queue_seconds: job.submitted.elapsed().as_secs_f64(),
        first_token_seconds: None,
        tokens_per_second: 0.0,
    }
}

pub struct Scheduler<B: Backend> {
    backend: B,
    shared: Arc<EngineShared>,
    /// The entries of the decode being built.
    batch: Vec<Entry>,
    /// In order of admission.
    running: Vec<Running>,
    free_seqs: Vec<i32>,
    cache: PrefixCache,
    /// The backend's sizes (fixed for its life).
    sizes: Sizes,
    /// Where every request's drafts come from, if anywhere.
    speculation: Option<Speculation>,
    /// What drafted tokens cost here, against what a step without them yields.
    costs: DraftCosts,
    /// Every counter `stats()` reports, counted here only.
    counters: Counters,
    /// The adapter scale this step decodes with: only requests generated with it take part.
    turn: Adapter,
    /// The adapter scale the engine started with: that of the slots it saves and restores.
    base_adapter: Adapter,
}

impl<B: Backend> Scheduler<B> {
    pub fn new(backend: B, shared: Arc<EngineShared>, prefix_cache: bool, speculation: Option<Speculation>) -> Self {
        let sizes = backend.sizes();
        let adapter = backend.adapter();
        Self {
            backend,
            shared,
            batch: Vec::with_capacity(sizes.n_batch),
            running: Vec::new(),
            // llama.cpp caps n_seq_max far below i32::MAX.
            free_seqs: (0..i32::try_from(sizes.n_seq_max).unwrap_or(i32::MAX)).rev().collect(),
            cache: PrefixCache::new(prefix_cache, sizes.n_seq_max),
            sizes,
            speculation,
            costs: DraftCosts::default(),
            counters: Counters::default(),
            turn: adapter,
            base_adapter: adapter,
        }
    }

    /// Serves only sequences `seqs` of the context (a caller's, whose other sequences are its
    /// own).
    pub fn on_sequences(mut self, seqs: &[i32]) -> Self {
        self.free_seqs = seqs.iter().rev().copied().collect();
        self
    }

    /// Takes what free sequence `seq` holds, `tokens` from position 0 (read there by the
    /// caller), into the prefix cache: requests whose prompts start so reuse them. False where
    /// `seq` is not free or the cache is off.
    pub fn adopt(&mut self, seq: i32, tokens: Vec<LlamaToken>) -> bool {
        if !self.cache.enabled() || !self.free_seqs.contains(&seq) {
            return false;
        }
        self.cache.keep(seq, tokens, self.backend.adapter());
        true
    }

    /// Serves requests until the engine closes, then ends every request left.
    pub fn run(mut self) {
        while let Some(admitted) = self.next_jobs() {
            self.do_chores();
            self.step_with(admitted);
        }
        self.abandon_chores();
        for running in &mut self.running {
            if running.phase.is_live() {
                running.phase = Phase::Ended(End::Cancelled);
            }
        }
        self.end_sequences(Instant::now());
    }

    /// One step now, for a caller that drives the loop itself (`context_loop.rs`): admits the
    /// waiting requests that fit, steps, and ends the sequences that ended. Whether requests
    /// are left, running or waiting.
    pub fn step_now(&mut self) -> bool {
        let admitted = self.arrived_jobs();
        self.step_with(admitted);
        !self.running.is_empty() || !self.shared.inbox().waiting.is_empty()
    }

    /// Admits `admitted`, steps, and ends the sequences that ended: a panicking step fails its
    /// requests and closes the engine.
    fn step_with(&mut self, admitted: Vec<Job>) {
        for job in admitted {
            self.admit(job);
        }
        let started = Instant::now();
        if catch_unwind(AssertUnwindSafe(|| self.step())).is_err() {
            for running in &mut self.running {
                running.phase = Phase::Ended(End::Failed(Error::Panic("the engine's step panicked".to_owned())));
            }
            self.shared.inbox().closed = true;
        }
        self.end_sequences(started);
    }

    /// The waiting requests that fit now, waiting while there is nothing to do; None once
    /// the engine is closed.
    fn next_jobs(&mut self) -> Option<Vec<Job>> {
        let mut cancelled = Vec::new();
        let mut admitted = Vec::new();
        let mut inbox = self.shared.inbox();
        loop {
            if inbox.closed {
                drop(inbox);
                finish_unstarted(cancelled);
                return None;
            }
            self.take_jobs(&mut inbox, &mut admitted, &mut cancelled);
            let work = !admitted.is_empty() || !self.running.is_empty() || !cancelled.is_empty();
            if work || !inbox.chores.is_empty() {
                break;
            }
            inbox = self
                .shared
                .wake
                .wait(inbox)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        drop(inbox);
        finish_unstarted(cancelled);
        Some(admitted)
    }

    /// The requests that arrived while prompts were read and fit now, without waiting.
    fn arrived_jobs(&self) -> Vec<Job> {
        let mut cancelled = Vec::new();
        let mut admitted = Vec::new();
        let mut inbox = self.shared.inbox();
        if !inbox.closed {
            self.take_jobs(&mut inbox, &mut admitted, &mut cancelled);
        }
        drop(inbox);
        finish_unstarted(cancelled);
        admitted
    }

    /// Moves the cancelled waiting requests to `cancelled`, then those at the front that fit
    /// (a free slot, and the KV cells they may need) to `admitted`: first come first served.
    fn take_jobs(&self, inbox: &mut Inbox, admitted: &mut Vec<Job>, cancelled: &mut Vec<Job>) {
        let cells = |job: &Job| job.cells(self.sizes.n_ctx_seq);
        let waiting: Vec<(usize, bool)> = inbox
            .waiting
            .iter()
            .map(|job| (cells(job), job.request.cancelled()))
            .collect();
        let reserved: usize = self.running.iter().map(|running| cells(&running.job)).sum::<usize>()
            + admitted.iter().map(cells).sum::<usize>();
        let free = self.free_seqs.len().saturating_sub(admitted.len());
        let (gone, starting) = plan::queue_exits(&waiting, free, reserved, self.sizes.n_ctx);
        for index in gone.into_iter().rev() {
            cancelled.extend(inbox.waiting.remove(index));
        }
        admitted.extend(inbox.waiting.drain(..starting));
    }

    fn admit(&mut self, mut job: Job) {
        let Some((seq, reused)) = self.place(&job) else {
            job.request.fail(Error::Runtime(
                "the engine admitted a request without a free sequence".to_owned(),
            ));
            return;
        };
        self.running.push(Running {
            picker: job.choosing.take_picker(self.sizes.n_vocab),
            steps: Steps::new(job.stop.clone(), job.max_tokens, self.sizes.n_ctx_seq),
            seq,
            kv_tokens: job.prompt[..reused].to_vec(),
            reused,
            phase: if job.max_tokens == 0 {
                Phase::Ended(End::Finished(Finish::Length))
            } else if job
                .held
                .as_ref()
                .is_some_and(|held| matches!(held.holds, Holds::Prompt))
            {
                Phase::Ready
            } else {
                Phase::Reading
            },
            tokens: Vec::new(),
            logprobs: Vec::new(),
            logprobs_sent: 0,
            text: String::new(),
            sampled: 0,
            draft_length: self
                .speculation
                .as_ref()
                .map(|speculation| DraftLength::new(speculation.source.most())),
            drafted: 0,
            accepted: 0,
            admitted: Instant::now(),
            first_token: None,
            last_token: None,
            turns_waited: 0,
            job,
        });
        self.make_room(seq);
    }

    /// Takes a free sequence for `job`: its own if held, else the one whose cells it reuses
    /// most (`PrefixCache::place`), left holding exactly them. The sequence, and how many
    /// prompt tokens it holds.
    fn place(&mut self, job: &Job) -> Option<(i32, usize)> {
        if let Some(held) = &job.held {
            self.free_seqs.contains(&held.seq).then_some(())?;
            self.free_seqs.retain(|&seq| seq != held.seq);
            let reused = match &held.holds {
                Holds::Prompt => return Some((held.seq, job.prompt.len())),
                Holds::Tokens(tokens) => job.whole_media(shared_start(tokens, &job.prompt)),
            };
            if matches!(self.backend.clear_cells(held.seq, reused, None), Ok(true)) {
                return Some((held.seq, reused));
            }
            // Reading the whole prompt is always possible once the sequence is empty.
            let _ = self.backend.clear_cells(held.seq, 0, None);
            return Some((held.seq, 0));
        }
        let adapter = job.adapter();
        let running = self
            .running
            .iter()
            .filter(|running| running.phase.is_live() && running.job.adapter() == adapter)
            .map(|running| (running.seq, running.kv_tokens.as_slice()));
        let mut placement = self.cache.place(&self.free_seqs, running, &job.prompt, adapter)?;
        self.free_seqs.retain(|&seq| seq != placement.seq);
        placement.reused = job.whole_media(placement.reused);
        let reused = match self.reuse(placement) {
            Ok(()) => placement.reused,
            // Reading the whole prompt is always possible; the slot was emptied for it.
            Err(_) => 0,
        };
        self.cache.forget(placement.seq);
        if reused > 0 {
            self.counters.prefix_cache_hits += 1;
        }
        Some((placement.seq, reused))
    }

    /// Leaves exactly the reused prompt start in the placed slot's KV cache.
    fn reuse(&mut self, placement: Placement) -> Result<()> {
        let (seq, kept) = (placement.seq, placement.reused);
        let outcome = (|| {
            if let Some(source) = placement.copy_from {
                self.backend.clear_cells(seq, 0, None)?;
                // Across KV streams llama.cpp copies whole sequences only.
                let to = self.sizes.kv_unified.then_some(kept);
                self.backend.copy_cells(source, seq, to)?;
            }
            self.backend.clear_cells(seq, kept, None)
        })();
        match outcome {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::value("the KV cache cannot cut a sequence")),
            Err(err) => {
                let _ = self.backend.clear_cells(seq, 0, None);
                Err(err)
            }
        }
    }

    /// With one KV stream for all sequences, the cells kept for reuse share it with the
    /// running ones: give up kept prompts (largest first) until the running requests' cells fit.
    fn make_room(&mut self, placed: i32) {
        if !self.sizes.kv_unified {
            return;
        }
        let reserved: usize = self
            .running
            .iter()
            .map(|running| running.job.cells(self.sizes.n_ctx_seq))
            .sum();
        while reserved + self.cache.cells() > self.sizes.n_ctx {
            let Some(seq) = self.cache.largest(placed) else { break };
            let _ = self.backend.clear_cells(seq, 0, None);
            self.cache.forget(seq);
            self.forget_drafts(seq);
        }
    }

    /// One decode of chunks of prompts being read (sampling where a prompt was read to its
    /// end), then one of the next token of every generating sequence. Prompts go first: a new
    /// request's first token does not wait for a decode of the others' tokens, nor does that
    /// of a request that arrived while the prompts were read, if the step's `n_batch` prompt
    /// tokens leave room for its prompt (read in a second decode of prompts).
    fn step(&mut self) {
        for running in &mut self.running {
            if running.phase.is_live() && running.job.request.cancelled() {
                running.phase = Phase::Ended(End::Cancelled);
            }
        }
        self.take_turn();
        self.sample_ready();
        self.read_media();
        let room = self.read_prompts(0, self.sizes.n_batch);
        let arrived_from = self.running.len();
        if room > 0 {
            for job in self.arrived_jobs() {
                self.admit(job);
            }
        }
        if self.running.len() > arrived_from {
            self.read_prompts(arrived_from, room);
        }
        self.generate();
        let turn = self.turn;
        for running in &mut self.running {
            running.turns_waited = if running.job.adapter() == turn {
                0
            } else {
                running.turns_waited.saturating_add(1)
            };
        }
    }

    /// Chooses the adapter scale of this step (llama.cpp applies an adapter to a whole decode):
    /// that of the live request that has waited the most steps for its turn, the earliest
    /// admitted among equals, so requests of every scale take turns. Sets it on the context;
    /// where that fails, the requests of that scale fail.
    fn take_turn(&mut self) {
        let next = self
            .running
            .iter()
            .enumerate()
            .filter(|(_, running)| running.phase.is_live())
            .min_by_key(|&(index, running)| (std::cmp::Reverse(running.turns_waited), index));
        let Some((_, next)) = next else { return };
        self.turn = next.job.adapter();
        let Some(bits) = self.turn.filter(|_| self.turn != self.backend.adapter()) else {
            return;
        };
        if let Err(err) = self.backend.set_adapter_scale(f32::from_bits(bits)) {
            let of_turn: Vec<usize> = (0..self.running.len())
                .filter(|&index| self.running[index].phase.is_live() && self.in_turn(&self.running[index]))
                .collect();
            self.fail(of_turn.into_iter(), err);
        }
    }

    /// Samples the first token of each request whose caller read its whole prompt, from the
    /// output row of the caller's last decode.
    fn sample_ready(&mut self) {
        for index in 0..self.running.len() {
            if !matches!(self.running[index].phase, Phase::Ready) || !self.in_turn(&self.running[index]) {
                continue;
            }
            match self.backend.last_row() {
                Ok(row) => {
                    self.counters.tokens_generated += 1;
                    Self::sample_or_fail(&self.backend, &mut self.running[index], row);
                }
                Err(err) => self.running[index].phase = Phase::Ended(End::Failed(err)),
            }
        }
    }

    /// Whether `running` takes part in this step's decodes (its adapter scale has the turn).
    fn in_turn(&self, running: &Running) -> bool {
        running.job.adapter() == self.turn
    }

    /// Decodes the last sampled token of every generating sequence in one batch, with the
    /// tokens drafted to follow it, and samples the next: then, while the token sampled is the
    /// next drafted one, the one after it, from that draft token's output. Every token is
    /// sampled as without drafts, by the request's own sampler from the model's output for the
    /// same tokens, so speculation changes the number of decodes, not the output. A failed
    /// decode (which changed nothing) fails every request in it, and its plan is logged.
    fn generate(&mut self) {
        let Some(plan) = self.plan_generation() else {
            return;
        };
        let proposing = Instant::now();
        let drafts = self.propose(&plan);
        let drafted: usize = drafts.iter().map(Vec::len).sum();
        self.costs.record_proposing(drafted, proposing.elapsed().as_secs_f64());
        let rows = self.add_generating(&plan.order, &drafts);
        let decoding = Instant::now();
        if let Err(err) = self.backend.decode(&self.batch) {
            let drafted: Vec<usize> = drafts.iter().map(Vec::len).collect();
            log_warning(format!(
                "llamactx engine: a generation decode failed ({err:?}); its plan: {plan:?}, drafted {drafted:?}"
            ));
            self.fail(plan.order.into_iter(), err);
            return;
        }
        if self.speculation.as_ref().is_some_and(|speculation| speculation.gated) {
            // A GPU decode returns before it is computed; its time is measured to the end.
            self.backend.finish_compute();
            self.costs
                .record_decode(plan.order.len() + drafted, decoding.elapsed().as_secs_f64());
        }
        self.prepare_constraints(&rows);
        for ((index, row), draft) in rows.into_iter().zip(drafts) {
            // Until the costs are measured, only drafts accepted whole pass.
            self.verify(index, row, &draft, plan.least_acceptance.unwrap_or(1.0));
        }
    }

    /// The generation decode of this step, from the requests' phases, draft lengths and the
    /// measured costs alone; None when no request generates.
    fn plan_generation(&self) -> Option<GenerationPlan> {
        let order: Vec<usize> = self
            .by_sequence()
            .into_iter()
            .filter(|&index| {
                matches!(self.running[index].phase, Phase::Generating(_)) && self.in_turn(&self.running[index])
            })
            .collect();
        if order.is_empty() {
            return None;
        }
        let least_acceptance = self.least_acceptance(order.len());
        let drafting = self.speculation.is_some() && can_pay(least_acceptance);
        let wanted: Vec<usize> = order
            .iter()
            .map(|&index| {
                if drafting {
                    self.running[index].draft_limit(self.sizes.n_ctx_seq)
                } else {
                    0
                }
            })
            .collect();
        let alike = !self.sizes.kv_unified;
        Some(GenerationPlan {
            draft_limits: plan::draft_lengths(&wanted, self.sizes.n_batch, alike),
            order,
            drafting,
            least_acceptance,
        })
    }

    /// Fills the batch with each generating request's last sampled token and its draft, every
    /// one with an output; returns each request's first output row.
    fn add_generating(&mut self, order: &[usize], drafts: &[Vec<LlamaToken>]) -> Vec<(usize, usize)> {
        self.batch.clear();
        let mut rows = Vec::with_capacity(order.len());
        for (&index, draft) in order.iter().zip(drafts) {
            let running = &self.running[index];
            let Phase::Generating(token) = running.phase else {
                continue;
            };
            let (start, seq) = (running.kv_len(), running.seq);
            rows.push((index, self.batch.len()));
            for (offset, &token) in std::iter::once(&token).chain(draft).enumerate() {
                self.batch.push(Entry {
                    token,
                    position: start + offset,
                    seq,
                    output: true,
                });
            }
        }
        rows
    }

    /// Reads chunks of the prompts being read by `running[from..]`, oldest request first: each
    /// the next `n_batch` tokens of its prompt (as `prefill` reads them), while they fit in
    /// `room` tokens, in one decode of prompts only. Returns the room left.
    ///
    /// Prompt chunks never share a decode with generating sequences' tokens: llama.cpp splits
    /// such a batch into micro-batches that mix one prompt token with the others, and the
    /// slightly different numbers changed a near-tie greedy token.
    fn read_prompts(&mut self, from: usize, room: usize) -> usize {
        let reading = self
            .running
            .iter()
            .enumerate()
            .skip(from)
            .filter(|(_, running)| matches!(running.phase, Phase::Reading) && self.in_turn(running))
            .map(|(index, running)| (index, running.job.text_end(running.kv_len()) - running.kv_len()));
        let (chunks, room) = plan::prompt_chunks(reading, room, self.sizes.n_batch);
        if chunks.is_empty() {
            return room;
        }
        if self.read_chunks(&chunks).is_err() {
            // Which prompt failed the decode (which changed nothing)? Each alone says.
            for (index, chunk) in chunks {
                if let Err(err) = self.read_chunks(&[(index, chunk)]) {
                    self.fail([index].into_iter(), err);
                }
            }
        }
        room
    }

    /// Decodes the given `(index in running, tokens)` prompt chunks in one batch, then samples
    /// the first token of each prompt read to its end.
    fn read_chunks(&mut self, chunks: &[(usize, usize)]) -> Result<()> {
        self.batch.clear();
        let mut rows = Vec::new();
        let mut in_order = chunks.to_vec();
        in_order.sort_by_key(|&(index, _)| self.running[index].seq);
        for &(index, chunk) in &in_order {
            let running = &self.running[index];
            let prompt = &running.job.prompt;
            for position in running.kv_len()..running.kv_len() + chunk {
                let output = position + 1 == prompt.len();
                if output {
                    rows.push((index, self.batch.len()));
                }
                self.batch.push(Entry {
                    token: prompt[position],
                    position,
                    seq: running.seq,
                    output,
                });
            }
        }
        self.backend.decode(&self.batch)?;
        for &(index, chunk) in chunks {
            self.counters.prompt_tokens_computed += chunk as u64;
            let running = &mut self.running[index];
            let read = &running.job.prompt[running.kv_len()..running.kv_len() + chunk];
            running.kv_tokens.extend_from_slice(read);
        }
        self.follow_prompts(chunks);
        self.prepare_constraints(&rows);
        for (index, row) in rows {
            self.counters.tokens_generated += 1;
            Self::sample_or_fail(&self.backend, &mut self.running[index], row);
        }
        Ok(())
    }

    /// Indices into `running`, in the order a decode lists them (`plan::decode_order`).
    fn by_sequence(&self) -> Vec<usize> {
        let seqs: Vec<i32> = self.running.iter().map(|running| running.seq).collect();
        plan::decode_order(&seqs)
    }

    /// Computes the constraint masks of the requests about to sample (`(index in running,
    /// row)`) in parallel, instead of one after another as each samples.
    fn prepare_constraints(&mut self, rows: &[(usize, usize)]) {
        let sampling: Vec<bool> = (0..self.running.len())
            .map(|index| rows.iter().any(|&(sampled, _)| sampled == index))
            .collect();
        let chains = self.running.iter_mut().zip(sampling).filter(|(_, samples)| *samples);
        prepare_first_stages(chains.map(|(running, _)| &mut running.picker.chain));
    }

    /// Fails the requests at `indices` with `err` (the first of them) and a pointer to it
    /// (the others).
    fn fail(&mut self, indices: impl Iterator<Item = usize>, err: Error) {
        let mut err = Some(err);
        for index in indices {
            let error = err.take().unwrap_or_else(|| {
                Error::Runtime(
                    "a decode that held this request's tokens failed (see the first request's error)".to_owned(),
                )
            });
            self.running[index].phase = Phase::Ended(End::Failed(error));
        }
    }

    /// Samples the next token of `running` from output row `row`; a failure ends it.
    fn sample_or_fail(backend: &B, running: &mut Running, row: usize) {
        if let Err(err) = Self::sample(backend, running, row) {
            running.phase = Phase::Ended(End::Failed(err));
        }
    }

    fn sample(backend: &B, running: &mut Running, row: usize) -> Result<()> {
        let picker = &mut running.picker;
        let chosen = match &picker.greedy {
            Some(greedy) => backend
                .read_logits(row, |logits| greedy.pick(logits))?
                .ok_or_else(no_token_left)?,
            None => backend
                .read_logits(row, |logits| select_from(&mut picker.chain, logits))??
                .id(),
        };
        let end_of_generation = backend.is_end_of_generation(chosen);
        // A grammar masks what it cannot take, so these only refuse what llama.cpp would abort on.
        refuse_unfinished_end(end_of_generation, &picker.chain, chosen)?;
        try_accept(&mut picker.chain, chosen).inspect_err(|_| picker.refused = true)?;
        let bytes = backend.token_bytes(chosen)?;
        let now = Instant::now();
        running.first_token.get_or_insert(now);
        running.last_token = Some(now);
        running.sampled += 1;
        let (piece, finish) = running.steps.take(&bytes, end_of_generation, running.kv_len());
        if !end_of_generation {
            running.tokens.push(chosen.0);
            if running.job.logprobs > 0 {
                let top = running.job.logprobs;
                let logprobs = backend.read_logits(row, |logits| top_logprobs(logits, chosen.0, top))?;
                running.logprobs.push(logprobs);
            }
        }
        if !piece.is_empty() {
            running.text.push_str(&piece);
            let logprobs = running.logprobs[running.logprobs_sent..].to_vec();
            running.logprobs_sent = running.logprobs.len();
            running.job.request.emit(piece, logprobs);
        }
        running.phase = match finish {
            Some(finish) => Phase::Ended(End::Finished(finish)),
            None => Phase::Generating(chosen),
        };
        Ok(())
    }

    /// Frees the slots of sequences that ended, updates the counters, then hands the requests
    /// their outcome (so a caller that sees the outcome sees the counters without it).
    fn end_sequences(&mut self, step_started: Instant) {
        let mut ended = Vec::new();
        let mut index = 0;
        while index < self.running.len() {
            if self.running[index].phase.is_live() {
                index += 1;
                continue;
            }
            let mut running = self.running.remove(index);
            if running.job.held.is_some() {
                // The caller's sequence: what it holds is the caller's.
            } else if self.cache.enabled() && !matches!(running.phase, Phase::Ended(End::Failed(_))) {
                self.cache.keep(
                    running.seq,
                    std::mem::take(&mut running.kv_tokens),
                    running.job.adapter(),
                );
            } else {
                // Its cells go back to the others; a sequence id from our own range cannot fail.
                let _ = self.backend.clear_cells(running.seq, 0, None);
                self.cache.forget(running.seq);
                self.forget_drafts(running.seq);
            }
            self.free_seqs.push(running.seq);
            ended.push(running);
        }
        self.publish_counters(step_started);
        for mut running in ended {
            if let Some(held) = running.job.held.take() {
                (held.on_end)(Ended {
                    sampler: std::mem::replace(&mut running.picker.chain, LlamaSampler::greedy()),
                    refused: running.picker.refused,
                    tokens: std::mem::take(&mut running.kv_tokens),
                });
            }
            match std::mem::replace(&mut running.phase, Phase::Reading) {
                Phase::Ended(End::Finished(finish)) => running.job.request.complete(running.completion(finish.name())),
                Phase::Ended(End::Failed(err)) => running.job.request.fail(err),
                Phase::Ended(End::Cancelled) | Phase::Reading | Phase::Ready | Phase::Generating(_) => {
                    running.job.request.complete(running.completion("cancelled"));
                }
            }
        }
    }

    fn publish_counters(&mut self, step_started: Instant) {
        self.counters.running = self.running.len();
        self.counters.kv_cells_used = self.running.iter().map(|running| running.kv_len()).sum();
        self.counters.kv_cells_cached = self.cache.cells();
        self.counters.busy_seconds += step_started.elapsed().as_secs_f64();
        *self.shared.counters() = self.counters;
    }
}

impl<B: Backend> Drop for Scheduler<B> {
    /// Closes the engine to new requests and ends those still waiting, also when the thread
    /// ends by a panic (running requests then fail as their jobs drop).
    fn drop(&mut self) {
        let left: Vec<Job> = {
            let mut inbox = self.shared.inbox();
            inbox.closed = true;
            inbox.waiting.drain(..).collect()
        };
        finish_unstarted(left);
    }
}

fn finish_unstarted(jobs: Vec<Job>) {
    for job in jobs {
        job.request.complete(unstarted(&job, "cancelled"));
    }
}

pub mod media;
pub mod slots;
pub mod speculation;
#[cfg(test)]
pub mod tests;
