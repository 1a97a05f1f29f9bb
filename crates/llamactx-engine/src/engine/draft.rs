//! Speculative drafts, and how many tokens each request drafts. A draft comes from the
//! request's own tokens (n-gram lookup, `ngram.rs`: where the last tokens already occurred in
//! the prompt or the output, the tokens that followed them then) or from a
//! smaller model with the same vocabulary (`draft_model.rs`); the scheduler verifies it in one
//! decode. How many tokens are proposed adapts to how many were accepted, so a request whose
//! drafts are rejected, or accepted too little to pay for their verification here
//! (`draft_cost.rs`), soon stops paying for them.

use std::sync::Arc;

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::token::LlamaToken;

use super::draft_model::DraftContext;
use super::ngram::lookup_draft;
use crate::errors::Result;
use crate::open_context::{ContextOptions, OpenContext};

/// The engine's n-gram speculation: at least `size_ngram` tokens must repeat for a draft, of at
/// most `size_mgram` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    pub size_ngram: u16,
    pub size_mgram: u16,
}

/// One request's wish for a draft: the tokens to follow `sampled`, which follows `history` (the
/// tokens of sequence `seq` in the KV cache), at most `limit` of them. Without a sampled token
/// (a prompt being read), nothing is drafted.
pub struct DraftRequest<'a> {
    pub seq: i32,
    pub history: &'a [LlamaToken],
    pub sampled: Option<LlamaToken>,
    pub limit: usize,
}

/// The engine's speculative decoding: where drafts come from, and with `gated`, a request
/// drafting only while its drafts accept enough to pay for their measured cost (`DraftCosts`).
pub struct Speculation {
    pub source: DraftSource,
    pub gated: bool,
}

/// Where drafts come from.
pub enum DraftSource {
    Ngram(NgramConfig),
    Model(Box<DraftContext>),
}

impl DraftSource {
    /// The most tokens one draft proposes.
    pub fn most(&self) -> usize {
        match self {
            Self::Ngram(config) => usize::from(config.size_mgram),
            Self::Model(context) => context.n_draft_max(),
        }
    }

    /// A draft for each request, in order (empty where its limit is 0 or nothing is proposed).
    pub fn propose(&mut self, requests: &[DraftRequest<'_>]) -> Vec<Vec<LlamaToken>> {
        match self {
            Self::Ngram(config) => requests
                .iter()
                .map(|request| {
                    let Some(sampled) = request.sampled.filter(|_| request.limit > 0) else {
                        return Vec::new();
                    };
                    let most = request.limit.min(usize::from(config.size_mgram));
                    lookup_draft(request.history, sampled, usize::from(config.size_ngram), most)
                })
                .collect(),
            Self::Model(context) => context.draft(requests),
        }
    }

    /// Brings the draft model's sequences up to the requests' histories (prompts just read by
    /// the target: requests without a sampled token).
    pub fn follow(&mut self, requests: &[DraftRequest<'_>]) {
        if let Self::Model(context) = self {
            context.follow(requests);
        }
    }

    /// Sequence `seq` no longer holds its tokens: neither do the draft model's cells for it.
    pub fn forget(&mut self, seq: i32) {
        if let Self::Model(context) = self {
            context.forget(seq);
        }
    }
}

/// The first draft length of a request: small, as a wrong draft costs its verification.
const FIRST_BUDGET: usize = 4;
/// The longest pause (in steps) after drafts that did not pay.
const MAX_PAUSE: u32 = 64;
/// The weight a draft's tokens keep in a request's recent acceptance at its next draft.
const RECENT_WEIGHT: f64 = 0.5;

/// One request's draft length, adapted to what its drafts had accepted.
#[derive(Debug)]
pub struct DraftLength {
    /// The longest draft.
    most: usize,
    /// The most tokens the next draft proposes.
    budget: usize,
    /// Drafts skipped before the next one is tried.
    pause: u32,
    /// Drafts in a row that did not pay.
    misses: u32,
    /// Recent drafted tokens, and those of them accepted (exponentially weighted).
    recent_drafted: f64,
    recent_accepted: f64,
}

impl DraftLength {
    pub fn new(most: usize) -> Self {
        Self {
            most,
            budget: FIRST_BUDGET.min(most),
            pause: 0,
            misses: 0,
            recent_drafted: 0.0,
            recent_accepted: 0.0,
        }
    }

    /// How many tokens a draft may propose now, at most `limit`: none while paused.
    pub fn wanted(&self, limit: usize) -> usize {
        if self.pause > 0 {
            0
        } else {
            self.budget.min(limit)
        }
    }

    /// A step in which the request could draft went by: a step of its pause, if any, is served.
    pub fn step_passed(&mut self) {
        self.pause = self.pause.saturating_sub(1);
    }

    /// Learns from a verified draft: `accepted` of its `drafted` tokens were what the model
    /// sampled. All accepted doubles the next draft's length; a partial acceptance sets it to
    /// what was accepted; none halves it. A draft that did not pay (none accepted, or the
    /// request's recent drafts accepted less than `least_acceptance` of their tokens:
    /// `DraftCosts`) pauses drafting for a number of steps that doubles with each such draft in
    /// a row; the draft after the pause is what measures the request again.
    pub fn record(&mut self, drafted: usize, accepted: usize, least_acceptance: f64) {
        if drafted == 0 {
            return;
        }
        // Draft lengths are far below 2**52.
        #[allow(clippy::cast_precision_loss)]
        {
            self.recent_drafted = RECENT_WEIGHT * self.recent_drafted + drafted as f64;
            self.recent_accepted = RECENT_WEIGHT * self.recent_accepted + accepted as f64;
        }
        self.budget = if accepted == drafted {
            (self.budget * 2).min(self.most)
        } else if accepted > 0 {
            accepted
        } else {
            (self.budget / 2).max(1)
        };
        if accepted > 0 && self.recent_accepted >= least_acceptance * self.recent_drafted {
            self.misses = 0;
        } else {
            self.misses += 1;
            self.pause = (1u32 << self.misses.min(6)).min(MAX_PAUSE);
        }
    }
}

/// Where drafts will come from, read from `speculative=` with the GIL held and opened without
/// it (`open`).
pub enum DraftChoice {
    Ngram(NgramConfig),
    Model {
        model: Arc<LlamaModel>,
        learned_positions: bool,
        n_draft_max: usize,
        p_min: f32,
    },
}

impl DraftChoice {
    /// The source: a draft model in a context of its own, opened with `options`
    /// (`draft_options`).
    pub fn open(self, target: &LlamaModel, options: &ContextOptions) -> Result<DraftSource> {
        Ok(match self {
            Self::Ngram(config) => DraftSource::Ngram(config),
            Self::Model {
                model,
                learned_positions,
                n_draft_max,
                p_min,
            } => DraftSource::Model(Box::new(DraftContext::open(
                target,
                model,
                learned_positions,
                options,
                n_draft_max,
                p_min,
            )?)),
        })
    }
}

/// The draft model's context options: the target's sequences, cells and batch sizes (so each
/// draft sequence holds what its target sequence does), `threads` (single-token, batch) and
/// the target's flash attention setting.
pub fn draft_options(
    native: &OpenContext,
    threads: (Option<i32>, Option<i32>),
    flash_attn_type: Option<i32>,
) -> ContextOptions {
    native.with(|context| ContextOptions {
        n_ctx: Some(context.n_ctx()),
        n_batch: Some(context.n_batch()),
        n_ubatch: Some(context.n_ubatch()),
        n_seq_max: Some(context.n_seq_max()),
        kv_unified: Some(native.kv_unified()),
        n_threads: threads.0,
        n_threads_batch: threads.1,
        flash_attn_type,
        ..ContextOptions::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(ids: &[i32]) -> Vec<LlamaToken> {
        ids.iter().copied().map(LlamaToken).collect()
    }

    const CONFIG: NgramConfig = NgramConfig {
        size_ngram: 2,
        size_mgram: 8,
    };

    fn ngram_draft(history: &[LlamaToken], sampled: i32, limit: usize) -> Vec<LlamaToken> {
        let request = DraftRequest {
            seq: 0,
            history,
            sampled: Some(LlamaToken(sampled)),
            limit,
        };
        DraftSource::Ngram(CONFIG).propose(&[request]).remove(0)
    }

    #[test]
    fn repeated_text_is_drafted_within_size_mgram_and_the_limit() {
        // 0 1 ... 19, then 0 ... 15, sampled 16: what followed "0 ... 16" is proposed, at most
        // size_mgram tokens (the lookup itself is tested in ngram.rs).
        let mut ids: Vec<i32> = (0..20).collect();
        ids.extend(0..16);
        let history = tokens(&ids);
        assert_eq!(ngram_draft(&history, 16, 100), tokens(&[17, 18, 19, 0, 1, 2, 3, 4]));
        assert_eq!(ngram_draft(&history, 16, 3), tokens(&[17, 18, 19]));
        assert_eq!(ngram_draft(&history, 16, 0), vec![]);
        // Nothing repeats: no draft.
        assert_eq!(ngram_draft(&history, 99, 100), vec![]);
    }

    /// The length of a draft in a step that drafts, as the scheduler asks it.
    fn next(length: &mut DraftLength, limit: usize) -> usize {
        let wanted = length.wanted(limit);
        length.step_passed();
        wanted
    }

    #[test]
    fn the_draft_length_follows_acceptance_and_misses_pause_drafting() {
        let mut drafter = DraftLength::new(8);
        assert_eq!(next(&mut drafter, 100), 4);
        drafter.record(4, 4, 0.0);
        assert_eq!(drafter.budget, 8);
        drafter.record(8, 8, 0.0);
        assert_eq!(drafter.budget, 8, "at most size_mgram");
        drafter.record(8, 3, 0.0);
        assert_eq!(drafter.budget, 3);
        drafter.record(3, 0, 0.0);
        assert_eq!((drafter.budget, drafter.pause), (1, 2));
        assert_eq!(next(&mut drafter, 100), 0);
        assert_eq!(next(&mut drafter, 100), 0);
        assert_eq!(next(&mut drafter, 100), 1);
        assert_eq!(next(&mut drafter, 0), 0, "never past the limit");
        drafter.record(1, 0, 0.0);
        assert_eq!(drafter.pause, 4, "each miss in a row doubles the pause");
        for _ in 0..10 {
            drafter.record(1, 0, 0.0);
        }
        assert_eq!(drafter.pause, MAX_PAUSE);
        drafter.record(1, 1, 0.0);
        assert_eq!((drafter.budget, drafter.misses), (2, 0));
    }

    #[test]
    fn drafts_accepting_less_than_they_cost_pause_drafting() {
        let mut drafter = DraftLength::new(16);
        // Half of each draft accepted pays where a third must be, not where four fifths must.
        drafter.record(4, 2, 0.33);
        assert_eq!((drafter.misses, drafter.pause), (0, 0));
        drafter.record(2, 1, 0.8);
        assert_eq!((drafter.misses, drafter.pause), (1, 2));
        // Recent drafts weigh more: after whole acceptances, the request pays again.
        drafter.record(2, 2, 0.8);
        drafter.record(4, 4, 0.8);
        assert_eq!(drafter.misses, 0, "{drafter:?}");
    }
}
