//! Speculative drafts from a request's own tokens (n-gram lookup, the crate's
//! `ngram_simple_draft`): where the last tokens already occurred in the prompt or the output,
//! the tokens that followed them then are proposed, and the scheduler verifies them all in one
//! decode. How many are proposed adapts to how many were accepted, so a request whose text does
//! not repeat soon stops paying for drafts.

use std::sync::Mutex;

use llama_cpp_4::ngram::ngram_simple_draft;
use llama_cpp_4::token::LlamaToken;
use pyo3::prelude::*;

use crate::errors::Error;

/// The engine's n-gram speculation: `size_ngram` tokens must repeat for a draft, of at most
/// `size_mgram` tokens; with `gated`, steps draft only where drafting measured faster
/// (`DraftGate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    pub size_ngram: u16,
    pub size_mgram: u16,
    pub gated: bool,
}

/// The first draft length of a request: small, as a wrong draft costs its verification.
const FIRST_BUDGET: usize = 4;
/// The longest pause (in steps) after drafts that were all rejected.
const MAX_PAUSE: u32 = 64;

/// One request's drafter and the adaptation of its draft length.
#[derive(Debug)]
pub struct Drafter {
    config: NgramConfig,
    /// The most tokens the next draft proposes.
    budget: usize,
    /// Drafts skipped before the next one is tried.
    pause: u32,
    /// Drafts in a row of which nothing was accepted.
    misses: u32,
}

impl Drafter {
    pub fn new(config: NgramConfig) -> Self {
        Self {
            config,
            budget: FIRST_BUDGET.min(usize::from(config.size_mgram)),
            pause: 0,
            misses: 0,
        }
    }

    /// The draft to verify after `sampled`, which follows `history` (the sequence's tokens in
    /// the KV cache): at most `limit` tokens, none when paused or when nothing repeats.
    pub fn draft(&mut self, history: &[LlamaToken], sampled: LlamaToken, limit: usize) -> Vec<LlamaToken> {
        if self.pause > 0 {
            self.pause -= 1;
            return Vec::new();
        }
        let mut draft =
            ngram_simple_draft(self.config.size_ngram, self.config.size_mgram, history, sampled).unwrap_or_default();
        draft.truncate(self.budget.min(limit));
        draft
    }

    /// Learns from a verified draft: `accepted` of its `drafted` tokens were what the model
    /// sampled. All accepted doubles the next draft's length; a partial acceptance sets it to
    /// what was accepted; none halves it and pauses drafting for a number of steps that
    /// doubles with each miss in a row.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let most = usize::from(self.config.size_mgram);
        if accepted == drafted {
            self.budget = (self.budget * 2).min(most);
            self.misses = 0;
        } else if accepted > 0 {
            self.budget = accepted.max(1);
            self.misses = 0;
        } else {
            self.budget = (self.budget / 2).max(1);
            self.misses += 1;
            self.pause = (1u32 << self.misses.min(6)).min(MAX_PAUSE);
        }
    }
}

/// Whether a step drafts: decided per number of generating requests from the tokens per
/// second that steps with and without drafts achieved at that number, so speculation is kept
/// only where it pays on this machine (on a CPU, a decode of a few sequences is already bound
/// by compute, and verifying drafts there costs more than it saves). One step in `PROBE_EVERY`
/// takes the other choice, so both rates stay current.
#[derive(Debug, Default)]
pub struct DraftGate {
    /// Per number of generating requests: the mean rate of steps without and with drafts
    /// (exponentially weighted; None until measured), and the steps taken so far.
    buckets: Vec<Bucket>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    rates: [Option<f64>; 2],
    steps: u64,
}

/// One step in this many takes the choice that measured slower.
const PROBE_EVERY: u64 = 16;
/// The weight of a new step in a mean rate.
const RATE_WEIGHT: f64 = 0.1;

impl DraftGate {
    /// Whether the next step, with `generating` requests, drafts.
    pub fn drafts(&mut self, generating: usize) -> bool {
        if self.buckets.len() <= generating {
            self.buckets.resize(generating + 1, Bucket::default());
        }
        let bucket = &mut self.buckets[generating];
        bucket.steps += 1;
        match bucket.rates {
            // Measure both first (a step that found nothing to draft counts as one without).
            [_, None] => true,
            [None, Some(_)] => false,
            [Some(plain), Some(drafted)] => (drafted >= plain) != (bucket.steps.is_multiple_of(PROBE_EVERY)),
        }
    }

    /// Records a step with `generating` requests, with drafts or not, that sampled `tokens` in
    /// `seconds`.
    pub fn record(&mut self, generating: usize, drafted: bool, tokens: usize, seconds: f64) {
        let Some(bucket) = self.buckets.get_mut(generating) else {
            return;
        };
        if seconds <= 0.0 {
            return;
        }
        // A rate for comparison: the precision lost past 2**52 tokens does not matter.
        #[allow(clippy::cast_precision_loss)]
        let rate = tokens as f64 / seconds;
        let mean = &mut bucket.rates[usize::from(drafted)];
        *mean = Some(mean.map_or(rate, |mean| mean + RATE_WEIGHT * (rate - mean)));
    }
}

/// One generation's n-gram drafter, for `stream`, `generate` and `ChatSession` (the engine
/// keeps its own per request): the drafts and the adaptation of their length that the engine
/// uses.
#[pyclass(frozen, module = "llamactx", name = "_NgramDrafter")]
pub struct PyNgramDrafter {
    drafter: Mutex<Drafter>,
}

#[pymethods]
impl PyNgramDrafter {
    #[new]
    fn new(size_ngram: u16, size_mgram: u16) -> Self {
        Self {
            drafter: Mutex::new(Drafter::new(NgramConfig {
                size_ngram,
                size_mgram,
                gated: false,
            })),
        }
    }

    /// The tokens to verify after `sampled`, which follows `history` (the sequence's tokens in
    /// the KV cache): at most `limit`, none when nothing repeats or drafting is paused.
    fn draft(&self, history: Vec<i32>, sampled: i32, limit: usize) -> PyResult<Vec<i32>> {
        let history: Vec<LlamaToken> = history.into_iter().map(LlamaToken).collect();
        let mut drafter = self.drafter.lock().map_err(|_| Error::Poisoned("_NgramDrafter"))?;
        Ok(drafter
            .draft(&history, LlamaToken(sampled), limit)
            .into_iter()
            .map(|token| token.0)
            .collect())
    }

    /// Learns that `accepted` of the last draft's `drafted` tokens were sampled.
    fn record(&self, drafted: usize, accepted: usize) -> PyResult<()> {
        let mut drafter = self.drafter.lock().map_err(|_| Error::Poisoned("_NgramDrafter"))?;
        drafter.record(drafted, accepted);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(ids: &[i32]) -> Vec<LlamaToken> {
        ids.iter().copied().map(LlamaToken).collect()
    }

    const HISTORY: [i32; 14] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1];

    const CONFIG: NgramConfig = NgramConfig {
        size_ngram: 2,
        size_mgram: 8,
        gated: true,
    };

    #[test]
    fn repeated_text_is_drafted_within_the_budget_and_the_limit() {
        let mut drafter = Drafter::new(CONFIG);
        // 0 1 2 3 ... 12, then 1 again, sampled 2: what followed "1 2" is proposed (a
        // repeat at position 0 counts as none, as in llama.cpp).
        let history = tokens(&HISTORY);
        assert_eq!(drafter.draft(&history, LlamaToken(2), 100), tokens(&[3, 4, 5, 6]));
        assert_eq!(drafter.draft(&history, LlamaToken(2), 3), tokens(&[3, 4, 5]));
        // Nothing repeats: no draft.
        assert_eq!(drafter.draft(&history, LlamaToken(99), 100), vec![]);
    }

    #[test]
    fn steps_draft_where_drafting_measured_faster_and_probe_the_other_choice() {
        let mut gate = DraftGate::default();
        // Nothing measured at 8 requests: a step with drafts, then one without.
        assert!(gate.drafts(8));
        gate.record(8, true, 10, 1.0);
        assert!(!gate.drafts(8));
        gate.record(8, false, 20, 1.0);
        // Without drafts was faster: no drafts, but for one step in PROBE_EVERY.
        let choices: Vec<bool> = (0..PROBE_EVERY).map(|_| gate.drafts(8)).collect();
        assert_eq!(choices.iter().filter(|&&drafts| drafts).count(), 1);
        // Each number of requests has its own rates: one request drafts where it paid.
        assert!(gate.drafts(1));
        gate.record(1, true, 30, 1.0);
        assert!(!gate.drafts(1));
        gate.record(1, false, 10, 1.0);
        assert!(gate.drafts(1));
        // Rates move with new steps: drafts at 8 requests become faster.
        for _ in 0..40 {
            gate.record(8, true, 40, 1.0);
        }
        assert!(gate.drafts(8));
    }

    #[test]
    fn the_draft_length_follows_acceptance_and_misses_pause_drafting() {
        let mut drafter = Drafter::new(CONFIG);
        drafter.record(4, 4);
        assert_eq!(drafter.budget, 8);
        drafter.record(8, 8);
        assert_eq!(drafter.budget, 8, "at most size_mgram");
        drafter.record(8, 3);
        assert_eq!(drafter.budget, 3);
        drafter.record(3, 0);
        assert_eq!((drafter.budget, drafter.pause), (1, 2));
        let history = tokens(&HISTORY);
        assert_eq!(drafter.draft(&history, LlamaToken(2), 100), vec![]);
        assert_eq!(drafter.draft(&history, LlamaToken(2), 100), vec![]);
        assert_eq!(drafter.draft(&history, LlamaToken(2), 100), tokens(&[3]));
        drafter.record(1, 0);
        assert_eq!(drafter.pause, 4, "each miss in a row doubles the pause");
        for _ in 0..10 {
            drafter.record(1, 0);
        }
        assert_eq!(drafter.pause, MAX_PAUSE);
        drafter.record(1, 1);
        assert_eq!((drafter.budget, drafter.misses), (2, 0));
    }
}
