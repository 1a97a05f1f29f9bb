//! The scheduler's slot chores (`engine/slots.rs`): saved, restored or erased between steps,
//! each on a slot no request holds.

use super::Scheduler;
use crate::engine::backend::Backend;
use crate::engine::slots::SlotChore;
use crate::errors::{Error, Result};

impl<B: Backend> Scheduler<B> {
    /// Does the chores whose slots are free; the others wait, in order, for a later step.
    pub fn do_chores(&mut self) {
        let chores: Vec<SlotChore> = self.shared.inbox().chores.drain(..).collect();
        if chores.is_empty() {
            return;
        }
        let mut waiting = Vec::new();
        for chore in chores {
            if chore.seq().is_some_and(|seq| !self.free_seqs.contains(&seq)) {
                waiting.push(chore);
                continue;
            }
            // A caller that stopped waiting has nothing to be told.
            let _ = match chore {
                SlotChore::Save { seq, reply } => reply.send(self.save(seq)).is_ok(),
                SlotChore::Restore { seq, file, reply } => reply.send(self.restore(seq, &file)).is_ok(),
                SlotChore::Erase { seq, reply } => reply.send(Ok(self.erase(seq))).is_ok(),
                SlotChore::List { reply } => reply.send(Ok(self.list())).is_ok(),
            };
        }
        let mut inbox = self.shared.inbox();
        for chore in waiting.into_iter().rev() {
            inbox.chores.push_front(chore);
        }
    }

    /// Answers every chore left when the engine stops.
    pub fn abandon_chores(&mut self) {
        let chores: Vec<SlotChore> = self.shared.inbox().chores.drain(..).collect();
        chores.into_iter().for_each(SlotChore::abandon);
    }

    fn save(&mut self, seq: Option<i32>) -> Result<Vec<Vec<u8>>> {
        // Saved slots are restored under the engine's first adapter scale: those computed
        // under another (a request's own) are not saved.
        let base = self.base_adapter;
        let seqs = match seq {
            Some(seq) if !self.cache.held(seq).is_empty() && self.cache.adapter(seq) != base => {
                return Err(Error::value(format!(
                    "slot {seq} holds cells of a request's own LoRA scale, not the engine's"
                )));
            }
            Some(seq) => vec![seq],
            None => self
                .free_seqs
                .iter()
                .copied()
                .filter(|&seq| !self.cache.held(seq).is_empty() && self.cache.adapter(seq) == base)
                .collect(),
        };
        seqs.into_iter()
            .map(|seq| {
                let tokens = self.cache.held(seq).to_vec();
                self.backend.save_seq(seq, &tokens)
            })
            .collect()
    }

    fn restore(&mut self, seq: Option<i32>, file: &[u8]) -> Result<(i32, usize)> {
        if !self.cache.enabled() {
            return Err(Error::value(
                "this engine has no prefix cache: a restored slot would never be reused",
            ));
        }
        let seq = match seq {
            Some(seq) => seq,
            None => self
                .cache
                .least_worth(&self.free_seqs)
                .ok_or_else(|| Error::value("every slot is busy"))?,
        };
        self.cache.forget(seq);
        self.forget_drafts(seq);
        let restored = self.backend.restore_seq(seq, file).map(|tokens| {
            let count = tokens.len();
            self.cache.keep(seq, tokens, self.base_adapter);
            (seq, count)
        });
        self.publish_cache();
        restored
    }

    fn list(&self) -> Vec<(i32, bool, usize)> {
        let mut slots: Vec<(i32, bool, usize)> = self
            .running
            .iter()
            .map(|running| (running.seq, true, running.kv_len()))
            .chain(
                self.free_seqs
                    .iter()
                    .map(|&seq| (seq, false, self.cache.held(seq).len())),
            )
            .collect();
        slots.sort_unstable();
        slots
    }

    /// Publishes the cached cells a chore changed.
    fn publish_cache(&mut self) {
        self.counters.kv_cells_cached = self.cache.cells();
        *self.shared.counters() = self.counters;
    }

    fn erase(&mut self, seq: i32) -> usize {
        let held = self.cache.held(seq).len();
        // A sequence id from our own range cannot fail.
        let _ = self.backend.clear_cells(seq, 0, None);
        self.cache.forget(seq);
        self.forget_drafts(seq);
        self.publish_cache();
        held
    }
}
