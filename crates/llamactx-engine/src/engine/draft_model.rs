//! Drafts from a draft model: a smaller model with the same vocabulary, in a context of its
//! own whose sequences follow the target's. Each step it reads the tokens its KV cache lacks
//! (the verified tokens since its last draft, or a whole prompt), then proposes its most likely
//! tokens one decode at a time, for every drafting request in the same decodes, while it is
//! confident enough. A failure here fails no request: the step goes without drafts.

use std::sync::Arc;

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::token::LlamaToken;

use super::draft::DraftRequest;
use crate::batch::BatchState;
use crate::errors::{Error, Result};
use crate::open_context::{ContextOptions, OpenContext};

/// The draft model's context, with one sequence per target sequence.
pub struct DraftContext {
    context: OpenContext,
    batch: BatchState,
    /// The tokens each sequence holds in the draft's KV cache, by sequence id.
    held: Vec<Vec<LlamaToken>>,
    n_batch: usize,
    n_draft_max: usize,
    /// A draft stops before a token the draft model gives less than this probability.
    p_min: f32,
}

/// Refuses speculative decoding for a model whose KV cache cannot be cut: rejected drafts
/// leave by cutting their cells, which a recurrent state cannot undo.
pub fn check_can_cut(model: &LlamaModel) -> Result<()> {
    if !can_cut(model) {
        return Err(Error::value(
            "speculative decoding needs a model whose KV cache can be cut; this one is recurrent or hybrid",
        ));
    }
    Ok(())
}

/// Whether the KV cache of `model` can be cut: not where a recurrent state holds the past.
fn can_cut(model: &LlamaModel) -> bool {
    !(model.is_recurrent() || model.is_hybrid())
}

/// Refuses a draft model whose tokens are not the target's, id for id (acceptance compares
/// ids), or whose KV cache cannot be cut back after a rejected draft.
fn check_draft_model(target: &LlamaModel, draft: &LlamaModel) -> Result<()> {
    let refuse = |why: String| {
        Err(Error::value(format!(
            "this draft model cannot draft for this model: {why}"
        )))
    };
    if draft.has_encoder() {
        return refuse("it has an encoder (T5-style); a draft model only decodes".to_owned());
    }
    if !can_cut(draft) {
        return refuse("it is recurrent or hybrid: its state cannot be cut back after a rejected draft".to_owned());
    }
    let (target_vocab, draft_vocab) = (target.get_vocab(), draft.get_vocab());
    if target_vocab.vocab_type() != draft_vocab.vocab_type() {
        return refuse("their vocabularies are of different types".to_owned());
    }
    if target.n_vocab() != draft.n_vocab() {
        return refuse(format!(
            "its vocabulary has {} tokens, the model's {}",
            draft.n_vocab(),
            target.n_vocab()
        ));
    }
    for id in 0..target.n_vocab() {
        let token = LlamaToken::new(id);
        let (ours, theirs) = (target_vocab.get_text_bytes(token), draft_vocab.get_text_bytes(token));
        if ours.ok() != theirs.ok() {
            return refuse(format!("token {id} has a different text in each vocabulary"));
        }
    }
    Ok(())
}

impl DraftContext {
    /// A context of `model`, checked to draft for `target`, with `options` (sequences and
    /// cells as the target's; `learned_positions` as `OpenContext::open`), drafting at most
    /// `n_draft_max` tokens while each has probability `p_min` (in 0..=1, as
    /// `SpeculativeOptions` checks) or more.
    pub fn open(
        target: &LlamaModel,
        model: Arc<LlamaModel>,
        learned_positions: bool,
        options: &ContextOptions,
        n_draft_max: usize,
        p_min: f32,
    ) -> Result<Self> {
        check_draft_model(target, &model)?;
        let context = OpenContext::open(model, options, learned_positions).map_err(|error| match error {
            Error::Value(message) => Error::value(format!("the draft model: {message}")),
            other => other,
        })?;
        context.require_memory()?;
        let (n_batch, n_seq_max) = context.with(|context| (context.n_batch() as usize, context.n_seq_max()));
        Ok(Self {
            batch: BatchState::new(n_batch, 1)?,
            context,
            held: vec![Vec::new(); n_seq_max as usize],
            n_batch,
            n_draft_max,
            p_min,
        })
    }

    /// The most tokens one draft proposes.
    pub fn n_draft_max(&self) -> usize {
        self.n_draft_max
    }

    /// A draft for each request, in order: empty where its limit is 0, where the draft model
    /// is not confident of the first token, or for all when a decode here failed (the draft's
    /// KV cache is then emptied, to be read again).
    pub fn draft(&mut self, requests: &[DraftRequest<'_>]) -> Vec<Vec<LlamaToken>> {
        let mut drafts = vec![Vec::new(); requests.len()];
        if requests.iter().all(|request| request.limit == 0) {
            return drafts;
        }
        if self.extend(requests, &mut drafts).is_err() {
            drafts.iter_mut().for_each(Vec::clear);
            self.reset();
        }
        drafts
    }

    /// Reads the requests' tokens where this context lacks them, without drafting: a prompt
    /// just read by the target, so that the request's first draft does not wait for it (and a
    /// step's measured speed is that of drafting, not of reading a prompt).
    pub fn follow(&mut self, requests: &[DraftRequest<'_>]) {
        let outcome = (|| {
            let mut reading = Vec::new();
            for (index, request) in requests.iter().enumerate() {
                reading.push((index, self.keep_shared(request)?));
            }
            self.read(requests, &mut reading, &mut [])
        })();
        if outcome.is_err() {
            self.reset();
        }
    }

    /// Empties the draft's KV cache, to be read again.
    fn reset(&mut self) {
        if matches!(self.context.clear_seq(None, None, None), Ok(true)) {
            self.held.iter_mut().for_each(Vec::clear);
        }
    }

    /// Sequence `seq` of the target no longer holds its tokens: its cells here go too.
    pub fn forget(&mut self, seq: i32) {
        let Some(held) = usize::try_from(seq).ok().and_then(|seq| self.held.get_mut(seq)) else {
            return;
        };
        if matches!(self.context.clear_seq(Some(i64::from(seq)), None, None), Ok(true)) {
            held.clear();
        }
    }

    /// Reads each drafting request's tokens the draft's cache lacks, then drafts.
    fn extend(&mut self, requests: &[DraftRequest<'_>], drafts: &mut [Vec<LlamaToken>]) -> Result<()> {
        // Each drafting request with the position its reading starts at.
        let mut reading = Vec::new();
        for (index, request) in requests.iter().enumerate() {
            if request.limit > 0 {
                reading.push((index, self.keep_shared(request)?));
            }
        }
        self.read(requests, &mut reading, drafts)?;
        self.continue_drafts(requests, drafts)
    }

    /// Cuts the request's sequence here to the tokens it shares with the request's history
    /// (the sampled token is always read again, for the output the draft starts from);
    /// returns how many it keeps.
    fn keep_shared(&mut self, request: &DraftRequest<'_>) -> Result<usize> {
        let seq = usize::try_from(request.seq)
            .ok()
            .filter(|&seq| seq < self.held.len())
            .ok_or_else(|| Error::value(format!("sequence {} is not one of the draft's", request.seq)))?;
        let held = &self.held[seq];
        let shared = held
            .iter()
            .zip(request.history)
            .take_while(|(held, wanted)| held == wanted)
            .count();
        if shared < held.len() {
            let kept = i64::try_from(shared).map_err(|_| Error::value("sequence too long"))?;
            if !self.context.clear_seq(Some(i64::from(request.seq)), Some(kept), None)? {
                return Err(Error::value("the draft's KV cache cannot cut a sequence"));
            }
            self.held[seq].truncate(shared);
        }
        Ok(shared)
    }

    /// Reads the requests' tokens from each one's position in `reading` to the end of its
    /// history, then its sampled token if it has one, in decodes of up to `n_batch` tokens;
    /// the output of each sampled token gives the first token of its draft.
    fn read(
        &mut self,
        requests: &[DraftRequest<'_>],
        reading: &mut [(usize, usize)],
        drafts: &mut [Vec<LlamaToken>],
    ) -> Result<()> {
        loop {
            self.batch.clear();
            let mut rows = Vec::new();
            for (index, next) in reading.iter_mut() {
                let request = &requests[*index];
                let end = request.history.len() + usize::from(request.sampled.is_some());
                while *next < end && self.batch.tokens.len() < self.n_batch {
                    // Past the history, only the sampled token is within `end`.
                    let Some(token) = request.history.get(*next).copied().or(request.sampled) else {
                        break;
                    };
                    let last = *next == request.history.len();
                    let row = self.add(request.seq, token, *next, last)?;
                    if last {
                        rows.push((*index, row));
                    }
                    *next += 1;
                }
            }
            if self.batch.tokens.is_empty() {
                return Ok(());
            }
            self.context.decode(&mut self.batch)?;
            for (index, row) in rows {
                if let Some(token) = self.confident_pick(row)? {
                    drafts[index].push(token);
                }
            }
        }
    }

    /// Decodes the last token of every draft that may grow, and adds the next, while the draft
    /// model is confident of it and the draft is shorter than its limit.
    fn continue_drafts(&mut self, requests: &[DraftRequest<'_>], drafts: &mut [Vec<LlamaToken>]) -> Result<()> {
        let mut growing: Vec<usize> = (0..requests.len())
            .filter(|&index| !drafts[index].is_empty() && drafts[index].len() < requests[index].limit)
            .collect();
        while !growing.is_empty() {
            self.batch.clear();
            let mut rows = Vec::new();
            for &index in &growing {
                let request = &requests[index];
                let draft = &drafts[index];
                // The sampled token is at the history's length; the draft follows it.
                let position = request.history.len() + draft.len();
                rows.push(self.add(request.seq, draft[draft.len() - 1], position, true)?);
            }
            self.context.decode(&mut self.batch)?;
            let mut still = Vec::new();
            for (index, row) in growing.into_iter().zip(rows) {
                if let Some(token) = self.confident_pick(row)? {
                    drafts[index].push(token);
                    if drafts[index].len() < requests[index].limit {
                        still.push(index);
                    }
                }
            }
            growing = still;
        }
        Ok(())
    }

    /// Adds `token` of sequence `seq` at `position` to the batch, and to what the sequence
    /// holds; returns its row.
    fn add(&mut self, seq: i32, token: LlamaToken, position: usize, logits: bool) -> Result<i32> {
        let row = self.batch.add_at(token, position, seq, logits)?;
        if let Some(held) = usize::try_from(seq).ok().and_then(|seq| self.held.get_mut(seq)) {
            held.push(token);
        }
        Ok(row)
    }

    /// The draft model's most likely token at output `row`, if its probability is at least
    /// `p_min`.
    fn confident_pick(&self, row: i32) -> Result<Option<LlamaToken>> {
        let p_min = self.p_min;
        self.context.read_row(row, |context, row| {
            let logits = context.get_logits_ith(row);
            let (best, &max) = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1))?;
            // Softmax of the best logit: 1 / sum(exp(l - max)); NaN fails the comparison.
            let total: f32 = logits.iter().map(|&logit| (logit - max).exp()).sum();
            let id = i32::try_from(best).ok()?;
            (1.0 / total >= p_min).then_some(LlamaToken::new(id))
        })
    }
}
