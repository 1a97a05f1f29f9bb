//! The scheduler's speculation: whether drafting pays at this load (`DraftCosts`), the drafts
//! a step's plan proposes, the draft model following what the target read, and the
//! verification of each drafted token against what the request's own sampler chooses.

use llama_cpp_4::token::LlamaToken;

use super::{End, GenerationPlan, Phase, Scheduler};
use crate::engine::backend::Backend;
use crate::engine::draft::DraftRequest;
use crate::engine::plan;
use crate::errors::Error;

impl<B: Backend> Scheduler<B> {
    /// The least share of its drafted tokens a request must see accepted for drafting to pay
    /// at `generating` requests: 0 without the gate, None until measured (`DraftCosts`).
    pub fn least_acceptance(&self, generating: usize) -> Option<f64> {
        match &self.speculation {
            Some(speculation) if speculation.gated => self.costs.least_acceptance(generating),
            _ => Some(0.0),
        }
    }

    /// The drafts of the requests of `step` (empty for all but in steps that draft); with a KV
    /// stream per sequence, as long for each (`plan::cut_to_shortest`). A step that drafts
    /// serves a step of each request's pause.
    pub(super) fn propose(&mut self, step: &GenerationPlan) -> Vec<Vec<LlamaToken>> {
        let Some(speculation) = self.speculation.as_mut().filter(|_| step.drafting) else {
            return vec![Vec::new(); step.order.len()];
        };
        for &index in &step.order {
            if let Some(length) = &mut self.running[index].draft_length {
                length.step_passed();
            }
        }
        let requests: Vec<DraftRequest<'_>> = step
            .order
            .iter()
            .zip(&step.draft_limits)
            .map(|(&index, &limit)| {
                let running = &self.running[index];
                DraftRequest {
                    seq: running.seq,
                    history: &running.kv_tokens,
                    sampled: match running.phase {
                        Phase::Generating(token) => Some(token),
                        _ => None,
                    },
                    limit,
                }
            })
            .collect();
        let mut drafts = speculation.source.propose(&requests);
        if !self.sizes.kv_unified {
            plan::cut_to_shortest(&mut drafts);
        }
        drafts
    }

    /// Reads the prompt chunks the target just read (`(index in running, tokens)`) into the draft
    /// model's context too, with the prompt, unless no draft can pay at this load (`can_pay`):
    /// a request's first draft then reads only its first token, and the measured cost of
    /// proposing is that of drafting, not of reading a prompt.
    pub fn follow_prompts(&mut self, chunks: &[(usize, usize)]) {
        if !can_pay(self.least_acceptance(self.running.len())) {
            return;
        }
        let Some(speculation) = &mut self.speculation else {
            return;
        };
        let read: Vec<DraftRequest<'_>> = chunks
            .iter()
            .map(|&(index, _)| &self.running[index])
            .map(|running| DraftRequest {
                seq: running.seq,
                history: &running.kv_tokens,
                sampled: None,
                limit: 0,
            })
            .collect();
        speculation.source.follow(&read);
    }

    /// Sequence `seq` was emptied: so is the draft model's.
    pub fn forget_drafts(&mut self, seq: i32) {
        if let Some(speculation) = &mut self.speculation {
            speculation.source.forget(seq);
        }
    }

    /// Samples the tokens of `running[index]` from its outputs from `row` on (`draft.len() + 1`
    /// of them), accepting drafted tokens while they are what was sampled, and removes the
    /// cells of the drafted tokens that were not. Its drafts pause unless they accept at least
    /// `least_acceptance` of their tokens (`DraftLength::record`).
    pub fn verify(&mut self, index: usize, row: usize, draft: &[LlamaToken], least_acceptance: f64) {
        let running = &mut self.running[index];
        let Phase::Generating(token) = running.phase else {
            return;
        };
        running.kv_tokens.push(token);
        self.counters.tokens_generated += 1;
        Self::sample_or_fail(&self.backend, running, row);
        let mut accepted = 0;
        for &drafted in draft {
            if !matches!(running.phase, Phase::Generating(chosen) if chosen == drafted) {
                break;
            }
            running.kv_tokens.push(drafted);
            accepted += 1;
            self.counters.tokens_generated += 1;
            Self::sample_or_fail(&self.backend, running, row + accepted);
        }
        if draft.is_empty() {
            return;
        }
        running.drafted += draft.len();
        running.accepted += accepted;
        self.counters.drafted_tokens += draft.len() as u64;
        self.counters.accepted_tokens += accepted as u64;
        if let Some(length) = &mut running.draft_length {
            length.record(draft.len(), accepted, least_acceptance);
        }
        if accepted < draft.len() {
            let cut = self.backend.clear_cells(running.seq, running.kv_len(), None);
            if !matches!(cut, Ok(true)) {
                let err = cut
                    .err()
                    .unwrap_or_else(|| Error::value("the KV cache cannot cut a sequence"));
                running.phase = Phase::Ended(End::Failed(err));
            }
        }
    }
}

/// Whether any draft can pay at a least acceptance of `least` (`Scheduler::least_acceptance`):
/// not where even drafts accepted whole would not. Then nobody drafts, nor does a draft model
/// read prompts; the fit forgets the drafting steps within a few hundred steps (`DraftCosts`),
/// and drafting is measured again, from drafts accepted whole.
pub fn can_pay(least: Option<f64>) -> bool {
    !least.is_some_and(|least| least >= 1.0)
}
