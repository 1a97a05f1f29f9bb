//! The scheduler's decisions, on a scripted model (`scripted.rs`): admission, prompt chunks,
//! requests arriving mid-step, drafts and their verification, cancellation and failed decodes,
//! checked through the decodes the scheduler asked for and what each request received.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;

use super::*;
use crate::engine::backend::Sizes;
use crate::engine::draft::{DraftSource, NgramConfig};
use crate::engine::scripted::{Scripted, FAILURE};
use crate::engine::slots::SlotChore;

/// Five tokens, 1 to 5, by position; in rounds 1, 8, 15, ... 6 takes the place of 5. N-gram
/// drafts of the round are accepted, those that propose 5 there rejected: after a prompt of
/// eight, the first draft proposes 5 at position 9 and is rejected whole.
fn cycle_at(position: usize) -> i32 {
    let (round, place) = (position / 5, position % 5);
    if place == 4 && round % 7 == 1 {
        6
    } else {
        1 + i32::try_from(place).unwrap_or(0)
    }
}

fn cycle(history: &[LlamaToken]) -> LlamaToken {
    LlamaToken::new(cycle_at(history.len()))
}

/// The tokens the script generates after a prompt of `prompt` tokens.
fn expected(prompt: usize, max_tokens: usize) -> Vec<i32> {
    (prompt..prompt + max_tokens).map(cycle_at).collect()
}

fn sizes(n_seq_max: usize) -> Sizes {
    Sizes {
        n_batch: 8,
        n_ctx: 64 * n_seq_max,
        n_seq_max,
        n_ctx_seq: 64,
        kv_unified: false,
        n_vocab: 16,
    }
}

struct Harness {
    scheduler: Scheduler<Scripted>,
    shared: Arc<EngineShared>,
}

fn harness(n_seq_max: usize, speculation: Option<Speculation>) -> Harness {
    harness_of(Scripted::new(sizes(n_seq_max), cycle), false, speculation)
}

fn harness_of(backend: Scripted, prefix_cache: bool, speculation: Option<Speculation>) -> Harness {
    let shared = EngineShared::new();
    Harness {
        scheduler: Scheduler::new(backend, Arc::clone(&shared), prefix_cache, speculation),
        shared,
    }
}

/// N-gram drafts at every step.
fn ngram() -> Speculation {
    Speculation {
        source: DraftSource::Ngram(NgramConfig {
            size_ngram: 3,
            size_mgram: 16,
        }),
        gated: false,
    }
}

fn job(shared: &Arc<EngineShared>, prompt: &[i32], max_tokens: usize) -> Job {
    Job {
        request: Arc::new(RequestShared::new(Arc::clone(shared))),
        prompt: prompt.iter().map(|&token| LlamaToken::new(token)).collect(),
        max_tokens,
        stop: Vec::new(),
        choosing: Choosing::Params(SamplingParams::greedy(), None),
        logprobs: 0,
        submitted: Instant::now(),
        media: Vec::new(),
        lora_scale: None,
        held: None,
    }
}

impl Harness {
    /// The harness, its scheduler serving only sequences `seqs` (as on a caller's context).
    fn on_sequences(self, seqs: &[i32]) -> Self {
        Self {
            scheduler: self.scheduler.on_sequences(seqs),
            shared: self.shared,
        }
    }

    fn submit(&self, prompt: &[i32], max_tokens: usize) -> Arc<RequestShared> {
        self.submit_job(job(&self.shared, prompt, max_tokens))
    }

    fn submit_job(&self, job: Job) -> Arc<RequestShared> {
        let request = Arc::clone(&job.request);
        self.shared.inbox().waiting.push_back(job);
        request
    }

    /// `job`'s completion, submitted alone and run to its end.
    fn alone(&mut self, job: Job) -> Completion {
        let request = self.submit_job(job);
        self.finish();
        completion(&request)
    }

    /// One step, with the requests that fit admitted first and the slot chores done (as `run`
    /// does).
    fn step(&mut self) {
        let admitted = self.scheduler.arrived_jobs();
        self.scheduler.do_chores();
        self.scheduler.step_with(admitted);
    }

    /// Queues the chore `make` builds; its answer comes on the receiver.
    fn chore<T>(&self, make: impl FnOnce(Sender<Result<T>>) -> SlotChore) -> Receiver<Result<T>> {
        let (reply, answer) = channel();
        self.shared.inbox().chores.push_back(make(reply));
        answer
    }

    /// The answer to a chore done at the next step.
    fn chore_now<T>(&mut self, make: impl FnOnce(Sender<Result<T>>) -> SlotChore) -> Result<T> {
        let answer = self.chore(make);
        self.step();
        answer
            .try_recv()
            .unwrap_or_else(|_| panic!("the chore was not done at the step"))
    }

    /// Steps until nothing runs or waits.
    fn finish(&mut self) {
        for _ in 0..1000 {
            if self.scheduler.running.is_empty() && self.shared.inbox().waiting.is_empty() {
                return;
            }
            self.step();
        }
        panic!("requests still running after 1000 steps");
    }

    fn decodes(&self) -> &[Vec<Entry>] {
        &self.scheduler.backend.decodes
    }

    /// The decodes that hold tokens of `prompt` (read as a prompt, at their positions).
    fn prompt_decodes(&self, prompt: &[i32]) -> Vec<usize> {
        let of_prompt = |entry: &Entry| prompt.get(entry.position) == Some(&entry.token.0) && !entry.output;
        (0..self.decodes().len())
            .filter(|&index| self.decodes()[index].iter().any(of_prompt))
            .collect()
    }
}

fn completion(request: &RequestShared) -> Completion {
    match request.ended() {
        Some(Ok(completion)) => completion,
        other => panic!("the request did not complete: {other:?}"),
    }
}

fn failure(request: &RequestShared) -> String {
    match request.ended() {
        Some(Err(message)) => message,
        other => panic!("the request did not fail: {other:?}"),
    }
}

#[test]
fn a_long_prompt_is_read_in_chunks_of_a_batch_in_decodes_of_its_own_while_another_generates() {
    let mut engine = harness(4, None);
    let first = engine.submit(&[1, 2, 3], 12);
    engine.step();
    let long: Vec<i32> = (0..20).map(|n| 7 + n % 5).collect();
    let second = engine.submit(&long, 4);
    engine.finish();
    let chunks: Vec<usize> = engine
        .prompt_decodes(&long)
        .into_iter()
        .map(|index| engine.decodes()[index].len())
        .collect();
    assert_eq!(chunks, [8, 8, 4]);
    // A prompt's chunk never shares a decode with generated tokens, and the first request
    // generated in each step a chunk was read in: one generation decode per step.
    let first_seq = engine.decodes()[0][0].seq;
    let prompt_length = |seq: i32| if seq == first_seq { 3 } else { long.len() };
    for decode in engine.decodes() {
        let reading = decode
            .iter()
            .filter(|entry| entry.position < prompt_length(entry.seq))
            .count();
        assert!(reading == 0 || reading == decode.len(), "{decode:?}");
    }
    assert_eq!(engine.decodes().len(), 4 + 11);
    assert_eq!(completion(&first).tokens, expected(3, 12));
    assert_eq!(completion(&second).tokens, expected(20, 4));
}

#[test]
fn a_request_arriving_while_a_prompt_is_read_is_read_and_generates_in_the_same_step() {
    let mut engine = harness(4, None);
    let first = engine.submit(&[1, 2, 3], 3);
    let late = job(&engine.shared, &[9, 9], 3);
    let second = Arc::clone(&late.request);
    let mut late = Some(late);
    let shared = Arc::clone(&engine.shared);
    engine.scheduler.backend.after_decode = Some(Box::new(move |_| {
        if let Some(job) = late.take() {
            shared.inbox().waiting.push_back(job);
        }
    }));
    engine.step();
    // The first prompt, then the late one in the batch's room, then both requests' next token.
    let seqs = |decode: &[Entry]| decode.iter().map(|entry| entry.seq).collect::<Vec<_>>();
    assert_eq!(engine.decodes().len(), 3);
    assert_eq!(engine.prompt_decodes(&[9, 9]), [1]);
    let (first_seq, late_seq) = (engine.decodes()[0][0].seq, engine.decodes()[1][0].seq);
    let mut both = vec![first_seq, late_seq];
    both.sort_unstable();
    assert_eq!(seqs(&engine.decodes()[2]), both);
    engine.finish();
    assert_eq!(completion(&first).tokens, expected(3, 3));
    assert_eq!(completion(&second).tokens, expected(2, 3));
}

#[test]
fn requests_wait_for_a_free_sequence_and_start_first_come_first_served() {
    let mut engine = harness(2, None);
    let requests: Vec<_> = [(7, 3), (8, 10), (9, 3), (10, 3)]
        .into_iter()
        .map(|(token, max_tokens)| engine.submit(&[token, token], max_tokens))
        .collect();
    engine.step();
    assert_eq!(engine.scheduler.running.len(), 2);
    assert_eq!(engine.shared.inbox().waiting.len(), 2);
    engine.finish();
    let started: Vec<usize> = [7, 8, 9, 10]
        .into_iter()
        .map(|token| engine.prompt_decodes(&[token, token])[0])
        .collect();
    assert_eq!(started[0], started[1], "the first two are read together");
    // The third starts when the first ends (3 tokens: 2 steps), the fourth when the third does.
    assert!(started[1] < started[2] && started[2] < started[3], "{started:?}");
    for (request, max_tokens) in requests.iter().zip([3, 10, 3, 3]) {
        assert_eq!(completion(request).tokens, expected(2, max_tokens));
    }
    assert!((0..2).all(|seq| engine.scheduler.backend.cells(seq).is_empty()));
}

#[test]
fn ngram_drafts_give_the_same_tokens_in_fewer_decodes_and_rejected_drafts_leave_no_cells() {
    let mut engine = harness(4, Some(ngram()));
    let prompt: Vec<i32> = (0..8).map(cycle_at).collect();
    let request = engine.submit(&prompt, 48);
    engine.finish();
    let done = completion(&request);
    assert_eq!(done.tokens, expected(8, 48));
    assert!(
        0 < done.accepted_tokens && done.accepted_tokens < done.drafted_tokens,
        "{done:?}"
    );
    // The first token comes from the prompt's decode; each later decode samples its own token
    // and the drafted ones it accepted.
    let generation: Vec<&Vec<Entry>> = engine.decodes().iter().skip(1).collect();
    assert_eq!(generation.len() + done.accepted_tokens, 47);
    // The scripted model refuses a decode that does not continue its sequence's cells, so the
    // cells of every rejected draft were cut before the next decode. A draft rejected whole
    // (the next decode starts right after its first entry) pauses drafting for two steps.
    let rejected_whole: Vec<usize> = (0..generation.len() - 1)
        .filter(|&step| {
            generation[step].len() > 1 && generation[step + 1][0].position == generation[step][0].position + 1
        })
        .collect();
    assert!(!rejected_whole.is_empty());
    for step in rejected_whole {
        let paused = &generation[step + 1..(step + 3).min(generation.len())];
        assert!(paused.iter().all(|decode| decode.len() == 1), "{paused:?}");
    }
    assert!(engine.scheduler.backend.cells(engine.decodes()[0][0].seq).is_empty());
}

#[test]
fn a_cancelled_request_ends_at_the_next_step_and_its_cells_are_freed() {
    let mut engine = harness(4, None);
    let cancelled = engine.submit(&[1, 2], 40);
    let other = engine.submit(&[3, 4], 8);
    for _ in 0..3 {
        engine.step();
    }
    cancelled.cancel();
    engine.step();
    let ended = completion(&cancelled);
    assert_eq!(ended.finish_reason, "cancelled");
    assert_eq!(ended.tokens, expected(2, ended.tokens.len()));
    let holding = (0..4)
        .filter(|&seq| !engine.scheduler.backend.cells(seq).is_empty())
        .count();
    assert_eq!(holding, 1, "only the other request's sequence holds cells");
    engine.finish();
    assert_eq!(completion(&other).tokens, expected(2, 8));
}

#[test]
fn a_failed_decode_fails_every_request_in_it_and_no_other() {
    let mut engine = harness(2, None);
    let failed = [engine.submit(&[1, 2, 3], 20), engine.submit(&[4, 5], 20)];
    let waiting = engine.submit(&[6, 7], 5);
    engine.step(); // the prompts' decode, then the generation's
    let next = engine.decodes().len();
    engine.scheduler.backend.failing.insert(next);
    engine.step();
    let mut messages: Vec<String> = failed.iter().map(|request| failure(request)).collect();
    messages.sort_unstable();
    assert!(
        messages[0].contains("a decode that held this request's tokens failed"),
        "{messages:?}"
    );
    assert!(messages[1].contains(FAILURE), "{messages:?}");
    // The step's plan is logged: the two requests, none drafting.
    let logged = crate::backend::queued_log_lines();
    let plan = logged.iter().find(|line| line.contains("a generation decode failed"));
    assert!(
        plan.is_some_and(|line| line.contains("GenerationPlan { order: [0, 1], drafting: false")),
        "{plan:?}"
    );
    engine.finish();
    assert_eq!(completion(&waiting).tokens, expected(2, 5));
    assert_eq!(engine.scheduler.counters.tokens_generated, 2 * 2 + 5);
}

/// The same completion: tokens, text, why it ended, tokens sampled, log-probabilities.
fn same_output(first: &Completion, second: &Completion) {
    assert_eq!(
        (&first.tokens, &first.text, first.finish_reason, first.completion_tokens),
        (
            &second.tokens,
            &second.text,
            second.finish_reason,
            second.completion_tokens
        )
    );
    assert_eq!(first.logprobs, second.logprobs);
}

/// A request's completion without drafts and with n-gram drafts.
fn without_and_with_drafts(
    backend: impl Fn() -> Scripted,
    make: impl Fn(&Arc<EngineShared>) -> Job,
) -> [Completion; 2] {
    let mut plain = harness_of(backend(), false, None);
    let without = plain.alone(make(&plain.shared));
    let mut drafting = harness_of(backend(), false, Some(ngram()));
    let with = drafting.alone(make(&drafting.shared));
    [without, with]
}

#[test]
fn stop_strings_and_max_tokens_end_a_reply_inside_a_draft_as_without_drafts() {
    let prompt: Vec<i32> = (0..8).map(cycle_at).collect();
    // The text of token t is " t": " 3 4" stops inside the drafts of a round.
    for (stop, max_tokens) in [
        (None, 1),
        (None, 2),
        (None, 13),
        (Some(" 3 4"), 40),
        (Some("5 1 2 3 4 5 1 2"), 40),
    ] {
        let [without, with] = without_and_with_drafts(
            || Scripted::new(sizes(4), cycle),
            |shared| {
                let mut job = job(shared, &prompt, max_tokens);
                job.stop = stop.map(str::to_owned).into_iter().collect();
                job
            },
        );
        same_output(&with, &without);
        let expected_reason = if stop.is_some() { "stop" } else { "length" };
        assert_eq!(with.finish_reason, expected_reason);
        // Two tokens leave no room to draft: the first comes with the prompt, the second ends it.
        assert_eq!(with.drafted_tokens > 0, max_tokens > 2, "{with:?}");
    }
}

#[test]
fn drafts_never_pass_the_end_of_a_sequence() {
    // 27 cells a sequence, the scripted model refusing a decode past them: the decode at
    // position 23 would draft six tokens, and drafts two.
    let small = || {
        Scripted::new(
            Sizes {
                n_ctx_seq: 27,
                ..sizes(4)
            },
            cycle,
        )
    };
    let prompt: Vec<i32> = (0..8).map(cycle_at).collect();
    let [without, with] = without_and_with_drafts(small, |shared| job(shared, &prompt, 100));
    same_output(&with, &without);
    assert_eq!(with.finish_reason, "length");
    assert_eq!(prompt.len() + with.completion_tokens, 27);
    assert!(with.accepted_tokens > 0);
}

#[test]
fn log_probabilities_with_drafts_are_those_without() {
    let prompt: Vec<i32> = (0..8).map(cycle_at).collect();
    let [without, with] = without_and_with_drafts(
        || Scripted::new(sizes(4), cycle),
        |shared| {
            let mut job = job(shared, &prompt, 30);
            job.logprobs = 2;
            job
        },
    );
    same_output(&with, &without);
    assert!(with.accepted_tokens > 0);
    assert_eq!(with.logprobs.len(), 30);
    for (row, &token) in with.logprobs.iter().zip(&with.tokens) {
        assert_eq!(row.len(), 3, "the chosen token, then the two most likely others");
        assert_eq!(row[0].0, token);
        assert!(row[0].1 > -0.001 && row[0].1 < 0.0, "{row:?}");
    }
}

#[test]
fn seeded_sampling_draws_with_drafts_what_it_draws_without() {
    // The script's token has a third of the probability: draws differ from it, and from seed
    // to seed, yet each is the draw without drafts (a drafted token is kept when it is drawn).
    let flat = || {
        let mut backend = Scripted::new(sizes(4), cycle);
        backend.peak = 2.0;
        backend
    };
    let prompt: Vec<i32> = (0..8).map(cycle_at).collect();
    let mut draws = std::collections::HashSet::new();
    let (mut drafted, mut accepted) = (0, 0);
    for seed in 0..6 {
        let [without, with] = without_and_with_drafts(flat, |shared| {
            let mut job = job(shared, &prompt, 24);
            job.choosing = Choosing::Params(SamplingParams::seeded(seed), None);
            job
        });
        same_output(&with, &without);
        drafted += with.drafted_tokens;
        accepted += with.accepted_tokens;
        draws.insert(with.tokens);
    }
    assert!(draws.len() > 1);
    assert!(0 < accepted && accepted < drafted, "{accepted} of {drafted}");
}

/// The cycle, ended by the end-of-generation token at position 12.
fn ends_at_twelve(history: &[LlamaToken]) -> LlamaToken {
    LlamaToken::new(if history.len() == 12 {
        crate::engine::scripted::END
    } else {
        cycle_at(history.len())
    })
}

#[test]
fn the_end_of_generation_ends_a_reply_with_stop_without_its_token() {
    let mut engine = harness_of(Scripted::new(sizes(4), ends_at_twelve), false, Some(ngram()));
    let done = engine.alone(job(&engine.shared, &[1, 2, 3, 4, 5, 1, 2, 3], 40));
    assert_eq!(done.finish_reason, "stop");
    assert_eq!(done.tokens, expected(8, 4));
    assert_eq!(done.completion_tokens, 5, "the end is sampled, not returned");
    assert_eq!(done.text, " 4 6 1 2");
}

#[test]
fn a_cancelled_waiting_request_leaves_the_queue_and_holds_no_place() {
    let mut engine = harness(1, None);
    let running = engine.submit(&[1, 2], 6);
    let cancelled = engine.submit(&[3, 4], 6);
    let behind = engine.submit(&[5, 6], 6);
    engine.step();
    cancelled.cancel();
    engine.finish();
    let ended = completion(&cancelled);
    assert_eq!((ended.finish_reason, ended.completion_tokens), ("cancelled", 0));
    assert!(engine.prompt_decodes(&[3, 4]).is_empty());
    assert_eq!(completion(&running).tokens, expected(2, 6));
    assert_eq!(completion(&behind).tokens, expected(2, 6));
}

#[test]
fn a_request_waits_for_the_kv_cells_it_may_need_though_a_sequence_is_free() {
    // 64 cells in all: two requests of 2 + 40 cells do not fit together.
    let mut engine = harness_of(Scripted::new(Sizes { n_ctx: 64, ..sizes(4) }, cycle), false, None);
    let first = engine.submit(&[1, 2], 40);
    let second = engine.submit(&[3, 4], 40);
    engine.step();
    assert_eq!(
        (engine.scheduler.running.len(), engine.shared.inbox().waiting.len()),
        (1, 1)
    );
    engine.finish();
    let [first_read, second_read] = [[1, 2], [3, 4]].map(|prompt| engine.prompt_decodes(&prompt)[0]);
    assert_eq!(
        second_read,
        first_read + 40,
        "read after the first request's last decode"
    );
    assert_eq!(completion(&first).tokens, expected(2, 40));
    assert_eq!(completion(&second).tokens, expected(2, 40));
}

#[test]
fn the_prefix_cache_reads_only_what_follows_a_finished_requests_prompt() {
    let mut engine = harness_of(Scripted::new(sizes(2), cycle), true, None);
    let shared_start: Vec<i32> = (0..12).map(|n| 7 + n % 4).collect();
    let first = engine.alone(job(&engine.shared, &shared_start, 4));
    let longer: Vec<i32> = shared_start.iter().copied().chain([1, 2, 3]).collect();
    let decodes_before = engine.decodes().len();
    let second = engine.alone(job(&engine.shared, &longer, 4));
    assert_eq!(first.cached_tokens, 0);
    assert_eq!(second.cached_tokens, 12);
    // Only the three new tokens were read (one decode), then four tokens generated.
    let read = &engine.decodes()[decodes_before];
    assert_eq!(
        read.iter().map(|entry| entry.position).collect::<Vec<_>>(),
        [12, 13, 14]
    );
    assert_eq!(second.tokens, expected(15, 4));
}

#[test]
fn a_steps_plan_is_a_value_made_without_acting_and_shares_the_batch_among_drafting_requests() {
    let mut engine = harness(4, Some(ngram()));
    let prompt: Vec<i32> = (0..8).map(cycle_at).collect();
    let requests: Vec<_> = (0..3).map(|_| engine.submit(&prompt, 30)).collect();
    // A prompt a decode: the third request generates from the third step on.
    for _ in 0..3 {
        engine.step();
    }
    let decodes = engine.decodes().len();
    let plan = engine.scheduler.plan_generation().expect("three requests generate");
    assert_eq!(plan.order.len(), 3);
    assert_eq!(
        engine.scheduler.plan_generation().as_ref(),
        Some(&plan),
        "planning changes nothing"
    );
    assert_eq!(engine.decodes().len(), decodes, "planning decodes nothing");
    let seqs: Vec<i32> = plan
        .order
        .iter()
        .map(|&index| engine.scheduler.running[index].seq)
        .collect();
    assert!(
        seqs.windows(2).all(|pair| pair[0] < pair[1]),
        "decode order is by sequence: {seqs:?}"
    );
    assert!(plan.drafting);
    // Eight entries a decode, three of them the sampled tokens: with a KV stream per sequence
    // each request may draft as many as the others, so one each.
    assert_eq!(plan.draft_limits, [1, 1, 1]);
    engine.finish();
    for request in &requests {
        assert_eq!(completion(request).tokens, expected(8, 30));
    }
}

#[test]
fn a_request_for_no_tokens_ends_with_length_and_decodes_nothing() {
    let mut engine = harness(2, None);
    let request = engine.submit(&[1, 2, 3], 0);
    engine.finish();
    let done = completion(&request);
    assert_eq!((done.finish_reason, done.tokens.len()), ("length", 0));
    assert!(engine.decodes().is_empty(), "{:?}", engine.decodes());
}

#[test]
fn a_request_cancelled_while_its_prompt_is_read_frees_its_cells_and_the_others_go_on() {
    let mut engine = harness(2, None);
    let other = engine.submit(&[1, 2], 6);
    let long: Vec<i32> = (0..20).map(|n| 7 + n % 5).collect();
    let cancelled = engine.submit(&long, 6);
    for _ in 0..4 {
        if !engine.prompt_decodes(&long).is_empty() {
            break;
        }
        engine.step();
    }
    let read = engine.prompt_decodes(&long).len();
    assert!(
        (1..3).contains(&read),
        "the prompt is being read ({read} of its 3 chunks)"
    );
    cancelled.cancel();
    engine.finish();
    let ended = completion(&cancelled);
    assert_eq!((ended.finish_reason, ended.tokens.len()), ("cancelled", 0));
    assert_eq!(
        engine.prompt_decodes(&long).len(),
        read,
        "no chunk is read after the cancel"
    );
    assert_eq!(completion(&other).tokens, expected(2, 6));
    assert!((0..2).all(|seq| engine.scheduler.backend.cells(seq).is_empty()));
}

#[test]
fn a_stop_string_ends_the_reply_before_it_and_frees_its_sequence() {
    let mut engine = harness(1, None);
    let mut stopped = job(&engine.shared, &[1, 2], 20);
    // The script's text after [1, 2] is " 3 4 5 1 2 3 4 ...": stop at the second " 2".
    stopped.stop = vec![" 1 2".to_owned()];
    let done = engine.alone(stopped);
    assert_eq!(done.finish_reason, "stop");
    assert_eq!(done.text, " 3 4 5");
    assert!(engine.scheduler.backend.cells(0).is_empty());
    let next = engine.submit(&[3, 4], 3);
    engine.finish();
    assert_eq!(completion(&next).tokens, expected(2, 3));
}

#[test]
fn a_saved_slot_restored_into_another_engine_is_reused_by_its_prefix_cache() {
    let prompt: Vec<i32> = (0..12).map(|n| 7 + n % 4).collect();
    let mut first = harness_of(Scripted::new(sizes(2), cycle), true, None);
    let original = first.alone(job(&first.shared, &prompt, 4));
    let files = first
        .chore_now(|reply| SlotChore::Save { seq: None, reply })
        .unwrap_or_else(|err| panic!("{err:?}"));
    assert_eq!(files.len(), 1, "one slot holds cached tokens");
    let mut second = harness_of(Scripted::new(sizes(2), cycle), true, None);
    let file = files[0].clone();
    let restored = second.chore_now(|reply| SlotChore::Restore { seq: None, file, reply });
    // The prompt and the tokens generated after it but the last (never decoded).
    assert_eq!(restored.ok(), Some((0, 12 + 3)));
    assert_eq!(second.scheduler.counters.kv_cells_cached, 15);
    let decodes_before = second.decodes().len();
    let again = second.alone(job(&second.shared, &prompt, 4));
    assert_eq!(again.tokens, original.tokens);
    assert_eq!(
        again.cached_tokens, 11,
        "all of the prompt but the token read again for its logits"
    );
    assert_eq!(second.decodes()[decodes_before][0].position, 11);
}

#[test]
fn a_chore_on_a_running_slot_waits_for_its_request_to_end() {
    let mut engine = harness_of(Scripted::new(sizes(2), cycle), true, None);
    let request = engine.submit(&[1, 2, 3], 6);
    engine.step();
    let running_seq = engine.scheduler.running[0].seq;
    // Listed at once: the running request's slot holds its prompt and first token so far.
    let listed = engine.chore_now(|reply| SlotChore::List { reply }).unwrap_or_default();
    assert_eq!(listed, [(0, true, 4), (1, false, 0)]);
    let saved = engine.chore(|reply| SlotChore::Save {
        seq: Some(running_seq),
        reply,
    });
    let other = engine.chore_now(|reply| SlotChore::Erase {
        seq: 1 - running_seq,
        reply,
    });
    assert_eq!(other.ok(), Some(0), "a chore on a free slot behind it is not held up");
    assert!(saved.try_recv().is_err(), "saved while its request runs");
    engine.finish();
    engine.step();
    let file = saved
        .try_recv()
        .ok()
        .and_then(Result::ok)
        .and_then(|files| files.into_iter().next())
        .unwrap_or_default();
    let held: Vec<i32> = [1, 2, 3]
        .into_iter()
        .chain(completion(&request).tokens[..5].iter().copied())
        .collect();
    let words: Vec<i32> = file
        .chunks_exact(4)
        .map(|word| i32::from_le_bytes([word[0], word[1], word[2], word[3]]))
        .collect();
    assert_eq!(words[0], 8);
    assert_eq!(words[1..9], held[..]);
}

#[test]
fn erasing_empties_a_slot_and_a_refused_file_leaves_it_empty() {
    let mut engine = harness_of(Scripted::new(sizes(2), cycle), true, None);
    engine.alone(job(&engine.shared, &[1, 2, 3, 4], 3));
    assert_eq!(
        engine.chore_now(|reply| SlotChore::Erase { seq: 0, reply }).ok(),
        Some(6)
    );
    assert!(engine.scheduler.backend.cells(0).is_empty());
    assert_eq!(engine.scheduler.counters.kv_cells_cached, 0);
    engine.alone(job(&engine.shared, &[1, 2, 3, 4], 3));
    let garbage = vec![1, 2, 3];
    let refused = engine.chore_now(|reply| SlotChore::Restore {
        seq: Some(0),
        file: garbage,
        reply,
    });
    assert!(refused.is_err());
    assert!(engine.scheduler.backend.cells(0).is_empty());
    assert!(engine.scheduler.cache.held(0).is_empty());
}

#[test]
fn restores_need_a_prefix_cache_and_a_stopping_engine_answers_its_chores() {
    let mut engine = harness(2, None);
    let refused = engine.chore_now(|reply| SlotChore::Restore {
        seq: None,
        file: Vec::new(),
        reply,
    });
    assert!(matches!(refused, Err(Error::Value(message)) if message.contains("no prefix cache")));
    let request = engine.submit(&[1, 2, 3], 50);
    engine.step();
    let seq = engine.scheduler.running[0].seq;
    let waiting = engine.chore(|reply| SlotChore::Erase { seq, reply });
    engine.shared.inbox().closed = true;
    engine.scheduler.run();
    assert!(matches!(waiting.try_recv(), Ok(Err(Error::Value(message))) if message.contains("closed")));
    assert_eq!(completion(&request).finish_reason, "cancelled");
}

fn job_scaled(shared: &Arc<EngineShared>, prompt: &[i32], max_tokens: usize, scale: f32) -> Job {
    let mut scaled = job(shared, prompt, max_tokens);
    scaled.lora_scale = Some(scale);
    scaled
}

/// An engine whose context has an adapter, at scale 1.
fn with_adapter() -> Harness {
    let mut backend = Scripted::new(sizes(2), cycle);
    backend.adapter = Some(1.0f32.to_bits());
    harness_of(backend, true, None)
}

#[test]
fn requests_of_different_adapter_scales_take_turns_in_decodes_of_their_own() {
    let mut engine = with_adapter();
    let full = engine.submit_job(job_scaled(&engine.shared, &[1, 2, 3], 6, 1.0));
    let half = engine.submit_job(job_scaled(&engine.shared, &[4, 5, 6, 7], 6, 0.5));
    engine.step();
    let scale_of: HashMap<i32, Option<u32>> = engine
        .scheduler
        .running
        .iter()
        .map(|running| (running.seq, running.job.lora_scale.map(f32::to_bits)))
        .collect();
    assert_eq!(scale_of.len(), 2);
    engine.finish();
    assert_eq!(completion(&full).tokens, expected(3, 6));
    assert_eq!(completion(&half).tokens, expected(4, 6));
    let backend = &engine.scheduler.backend;
    for (entries, adapter) in backend.decodes.iter().zip(&backend.decode_adapters) {
        // Every entry of a decode is of a request generated under the scale the decode ran with.
        assert!(
            entries.iter().all(|entry| scale_of[&entry.seq] == *adapter),
            "{entries:?} under {adapter:?}"
        );
    }
    // Turns alternate: neither scale waits for the other to finish.
    let turns: Vec<Option<u32>> = backend.decode_adapters.clone();
    let first_half = turns.iter().position(|&adapter| adapter == Some(0.5f32.to_bits()));
    let last_full = turns.iter().rposition(|&adapter| adapter == Some(1.0f32.to_bits()));
    assert!(first_half < last_full, "the scales took turns: {turns:?}");
}

#[test]
fn the_prefix_cache_reuses_cells_only_under_the_scale_they_were_computed_with() {
    let mut engine = with_adapter();
    let prompt: Vec<i32> = (0..12).map(|n| 7 + n % 4).collect();
    engine.alone(job_scaled(&engine.shared, &prompt, 3, 1.0));
    let other = engine.alone(job_scaled(&engine.shared, &prompt, 3, 0.5));
    assert_eq!(other.cached_tokens, 0, "cells of scale 1 are not those of scale 0.5");
    let same = engine.alone(job_scaled(&engine.shared, &prompt, 3, 1.0));
    assert_eq!(same.cached_tokens, 11);
    // Slots are saved under the engine's own scale only.
    let saved = engine.chore_now(|reply| SlotChore::Save { seq: None, reply });
    assert_eq!(saved.map(|files| files.len()).ok(), Some(1));
    let refused = engine.chore_now(|reply| SlotChore::Save { seq: Some(1), reply });
    assert!(matches!(refused, Err(Error::Value(message)) if message.contains("own LoRA scale")));
}

/// What a held request's `on_end` received.
type EndSlot = Arc<Mutex<Option<(Vec<i32>, bool)>>>;

/// A request on sequence `seq`, whose cells the caller filled with `prompt` (the last with
/// logits, in the backend's last decode), as `continue_sequence` submits it.
fn held_job(shared: &Arc<EngineShared>, prompt: &[i32], max_tokens: usize, seq: i32) -> (Job, EndSlot) {
    held_job_on(shared, prompt, max_tokens, seq, Holds::Prompt)
}

/// A request on sequence `seq`, which holds `holds`.
fn held_job_on(
    shared: &Arc<EngineShared>,
    prompt: &[i32],
    max_tokens: usize,
    seq: i32,
    holds: Holds,
) -> (Job, EndSlot) {
    let slot: EndSlot = Arc::default();
    let mut held = job(shared, prompt, max_tokens);
    let filled = Arc::clone(&slot);
    let read = prompt.len();
    held.held = Some(Held {
        seq,
        holds,
        on_end: Box::new(move |ended: Ended| {
            let decoded = ended.tokens[read..].iter().map(|token| token.0).collect();
            *filled.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((decoded, ended.refused));
        }),
    });
    (held, slot)
}

/// A scripted context whose sequence `seq` the caller read `prompt` into.
fn read_by_the_caller(n_seq_max: usize, seq: i32, prompt: &[i32]) -> Scripted {
    let mut backend = Scripted::new(sizes(n_seq_max), cycle);
    let entries: Vec<Entry> = (0..prompt.len())
        .map(|position| Entry {
            token: LlamaToken::new(prompt[position]),
            position,
            seq,
            output: position + 1 == prompt.len(),
        })
        .collect();
    backend.decode(&entries).expect("the caller's prompt decodes");
    backend.decodes.clear();
    backend
}

fn ended(slot: &EndSlot) -> (Vec<i32>, bool) {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
        .expect("on_end was called")
}

#[test]
fn a_held_request_samples_from_the_callers_row_and_leaves_its_cells_to_the_caller() {
    let prompt = [1, 2, 3];
    let mut engine = harness_of(read_by_the_caller(4, 2, &prompt), false, None).on_sequences(&[2]);
    let (held, slot) = held_job(&engine.shared, &prompt, 6, 2);
    let request = engine.submit_job(held);
    engine.finish();
    assert_eq!(completion(&request).tokens, expected(3, 6));
    // The prompt was not read again: the first decode is the first sampled token's.
    assert_eq!(engine.decodes()[0].len(), 1);
    assert_eq!(engine.decodes()[0][0].position, 3);
    // The last token (max_tokens) is sampled, not decoded; the rest stay in the caller's cells.
    let (decoded, refused) = ended(&slot);
    assert_eq!(decoded, expected(3, 5));
    assert!(!refused);
    let cells: Vec<i32> = engine.scheduler.backend.cells(2).iter().map(|token| token.0).collect();
    assert_eq!(cells, [&prompt[..], &decoded].concat());
}

#[test]
fn a_held_request_with_rejected_drafts_leaves_exactly_its_tokens_in_the_callers_cells() {
    // After a prompt of eight, the first n-gram draft is rejected whole (see `cycle_at`).
    let prompt: Vec<i32> = expected(0, 8);
    let mut engine = harness_of(read_by_the_caller(1, 0, &prompt), false, Some(ngram()));
    let (held, slot) = held_job(&engine.shared, &prompt, 20, 0);
    let request = engine.submit_job(held);
    engine.finish();
    let done = completion(&request);
    assert_eq!(done.tokens, expected(8, 20));
    assert!(
        done.drafted_tokens > done.accepted_tokens && done.accepted_tokens > 0,
        "{done:?}"
    );
    let (decoded, _) = ended(&slot);
    let cells: Vec<i32> = engine.scheduler.backend.cells(0).iter().map(|token| token.0).collect();
    assert_eq!(cells, [&prompt[..], &decoded].concat());
    assert_eq!(decoded, expected(8, 19));
}

#[test]
fn a_cancelled_held_request_hands_back_what_it_decoded() {
    let prompt = [1, 2, 3];
    let mut engine = harness_of(read_by_the_caller(1, 0, &prompt), false, None);
    let (held, slot) = held_job(&engine.shared, &prompt, 50, 0);
    let request = engine.submit_job(held);
    for _ in 0..4 {
        engine.step();
    }
    request.cancel();
    engine.step();
    assert_eq!(completion(&request).finish_reason, "cancelled");
    let (decoded, _) = ended(&slot);
    assert_eq!(decoded, expected(3, 4), "four steps decoded four sampled tokens");
    let cells: Vec<i32> = engine.scheduler.backend.cells(0).iter().map(|token| token.0).collect();
    assert_eq!(cells, [&prompt[..], &decoded].concat());
}

fn tokens_of(values: &[i32]) -> Vec<LlamaToken> {
    values.iter().map(|&token| LlamaToken::new(token)).collect()
}

#[test]
fn a_held_request_reads_only_what_follows_the_start_its_sequence_shares() {
    // The caller's sequence holds an earlier turn; the new prompt shares its first three tokens.
    let earlier = [1, 2, 3, 4, 5];
    let prompt = [1, 2, 3, 9, 9, 7];
    let mut engine = harness_of(read_by_the_caller(1, 0, &earlier), false, None);
    let (held, slot) = held_job_on(&engine.shared, &prompt, 4, 0, Holds::Tokens(tokens_of(&earlier)));
    let request = engine.submit_job(held);
    engine.finish();
    let done = completion(&request);
    assert_eq!(done.cached_tokens, 3);
    assert_eq!(done.tokens, expected(6, 4));
    // The first decode reads the three tokens after the shared start, at their positions.
    let first: Vec<(usize, i32)> = engine.decodes()[0]
        .iter()
        .map(|entry| (entry.position, entry.token.0))
        .collect();
    assert_eq!(first, [(3, 9), (4, 9), (5, 7)]);
    let (decoded, _) = ended(&slot);
    let cells: Vec<i32> = engine.scheduler.backend.cells(0).iter().map(|token| token.0).collect();
    assert_eq!(
        cells,
        [&prompt[..], &decoded].concat(),
        "the earlier turn's tail is cleared"
    );
    assert_eq!(decoded, expected(6, 3));
}

#[test]
fn a_held_request_whose_sequence_holds_its_whole_prompt_reads_the_last_token_again() {
    // Held tokens give no logits: the prompt's last token is read again for them.
    let prompt = [1, 2, 3, 4];
    let mut engine = harness_of(read_by_the_caller(1, 0, &[1, 2, 3, 4, 5, 1]), false, None);
    let (held, _) = held_job_on(
        &engine.shared,
        &prompt,
        2,
        0,
        Holds::Tokens(tokens_of(&[1, 2, 3, 4, 5, 1])),
    );
    let request = engine.submit_job(held);
    engine.finish();
    assert_eq!(completion(&request).cached_tokens, 3);
    assert_eq!(engine.decodes()[0].len(), 1);
    assert_eq!(
        (engine.decodes()[0][0].position, engine.decodes()[0][0].token.0),
        (3, 4)
    );
}

#[test]
fn a_held_request_on_a_sequence_holding_other_tokens_reads_its_whole_prompt() {
    let mut engine = harness_of(read_by_the_caller(1, 0, &[7, 7, 7]), false, None);
    let (held, _) = held_job_on(&engine.shared, &[1, 2], 3, 0, Holds::Tokens(Vec::new()));
    let request = engine.submit_job(held);
    engine.finish();
    let done = completion(&request);
    assert_eq!((done.cached_tokens, done.tokens), (0, expected(2, 3)));
    // Cells the caller did not say it holds are cleared all the same.
    let cells: Vec<i32> = engine.scheduler.backend.cells(0).iter().map(|token| token.0).collect();
    assert_eq!(cells, [&[1, 2][..], &expected(2, 2)].concat());
}

#[test]
fn a_loop_on_some_sequences_of_a_context_decodes_into_those_only() {
    let mut engine = harness(4, None).on_sequences(&[1, 3]);
    let requests: Vec<_> = (0..3).map(|n| engine.submit(&[1, 2, 3 + n], 5)).collect();
    engine.step();
    assert_eq!(
        engine.scheduler.running.len(),
        2,
        "two sequences: the third request waits"
    );
    engine.finish();
    for request in &requests {
        assert_eq!(completion(request).tokens.len(), 5);
    }
    let seqs: std::collections::HashSet<i32> = engine.decodes().iter().flatten().map(|entry| entry.seq).collect();
    assert_eq!(seqs, [1, 3].into_iter().collect());
    // Finished sequences free their cells for the next request.
    assert!(engine.scheduler.backend.cells(1).is_empty() && engine.scheduler.backend.cells(3).is_empty());
}

#[test]
fn a_held_request_refused_by_its_sequence_fails_instead_of_taking_another() {
    let mut engine = harness(2, None).on_sequences(&[0]);
    let (held, _) = held_job(&engine.shared, &[1, 2], 4, 1);
    let request = engine.submit_job(held);
    engine.finish();
    assert!(
        failure(&request).contains("without a free sequence"),
        "{}",
        failure(&request)
    );
}

#[test]
fn requests_reuse_a_prefix_the_caller_read_and_copied_into_their_sequences() {
    let prefix = [1, 2, 3];
    let mut backend = read_by_the_caller(2, 0, &prefix);
    backend.copy_cells(0, 1, None).expect("the caller's copy");
    let mut engine = harness_of(backend, true, None);
    assert!(engine.scheduler.adopt(0, to_tokens(&prefix)) && engine.scheduler.adopt(1, to_tokens(&prefix)));
    assert!(
        !engine.scheduler.adopt(2, to_tokens(&prefix)),
        "not a sequence of this loop"
    );
    let requests = [engine.submit(&[1, 2, 3, 4, 5], 4), engine.submit(&[1, 2, 3, 4, 7], 4)];
    engine.finish();
    for request in &requests {
        assert_eq!(completion(request).cached_tokens, 3);
        assert_eq!(completion(request).tokens, expected(5, 4));
    }
    assert!(
        engine.decodes().iter().flatten().all(|entry| entry.position >= 3),
        "the prefix is read once, by the caller"
    );
}

fn to_tokens(ids: &[i32]) -> Vec<LlamaToken> {
    ids.iter().map(|&id| LlamaToken::new(id)).collect()
}
