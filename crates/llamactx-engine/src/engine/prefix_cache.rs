//! Prompt prefix reuse: a request whose prompt starts like tokens already in the KV cache
//! (a shared system prompt, the previous turn of a chat) reads only the rest.
//!
//! A finished request leaves its tokens in its sequence slot; the next request takes the free
//! slot whose tokens share the longest start with its prompt, and keeps that much. When a
//! running sequence shares more, its cells are copied into a free slot (with a KV stream per
//! sequence llama.cpp copies the whole stream, and the copy is then cut back).

use llama_cpp_4::token::LlamaToken;

/// What a sequence's cells were computed under: the LoRA adapter's scale (its bits), or None
/// without an adapter. Cells computed under one scale are not another's.
pub type Adapter = Option<u32>;

/// The fewest tokens worth copying from a running sequence. A copy is not free: with a KV
/// stream per sequence llama.cpp copies the whole stream, and 8 sequences that had copied a
/// mere BOS token generated at two thirds of the speed (`benches/engine.py`).
pub const MIN_COPY: usize = 64;

/// Where a new request goes and what it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub seq: i32,
    /// Prompt tokens already in the KV cache (at most all but the last, whose logits are needed).
    pub reused: usize,
    /// A running sequence to copy the cells from first.
    pub copy_from: Option<i32>,
}

pub struct PrefixCache {
    enabled: bool,
    /// The tokens each free slot holds in the KV cache, by sequence id.
    slots: Vec<Vec<LlamaToken>>,
    /// What each slot's cells were computed under.
    adapters: Vec<Adapter>,
}

/// How many tokens `prompt` starts with that `held` starts with too, all but the prompt's last at
/// most: a prompt's last token is read for its logits.
pub fn shared_start(held: &[LlamaToken], prompt: &[LlamaToken]) -> usize {
    let usable = prompt.len().saturating_sub(1);
    held.iter().zip(&prompt[..usable]).take_while(|(a, b)| a == b).count()
}

impl PrefixCache {
    pub fn new(enabled: bool, n_seq: usize) -> Self {
        Self {
            enabled,
            slots: vec![Vec::new(); n_seq],
            adapters: vec![None; n_seq],
        }
    }

    /// What free slot `seq`'s cells were computed under.
    pub fn adapter(&self, seq: i32) -> Adapter {
        usize::try_from(seq)
            .ok()
            .and_then(|index| self.adapters.get(index).copied())
            .flatten()
    }

    /// The tokens free slot `seq` holds (none for a running one).
    pub fn held(&self, seq: i32) -> &[LlamaToken] {
        self.slot(seq)
    }

    /// The slot of `free` whose cached tokens are worth least (the fewest; the lowest id).
    pub fn least_worth(&self, free: &[i32]) -> Option<i32> {
        free.iter().copied().min_by_key(|&seq| (self.slot(seq).len(), seq))
    }

    fn slot(&self, seq: i32) -> &[LlamaToken] {
        usize::try_from(seq)
            .ok()
            .and_then(|index| self.slots.get(index))
            .map_or(&[], Vec::as_slice)
    }

    /// The placement of `prompt`, to be computed under `adapter`, among the `free` slots,
    /// copying from one of `running` (sequence, tokens in its KV cache, all computed under
    /// `adapter`) where that keeps more. None when no slot is free.
    pub fn place<'a>(
        &self,
        free: &[i32],
        running: impl Iterator<Item = (i32, &'a [LlamaToken])>,
        prompt: &[LlamaToken],
        adapter: Adapter,
    ) -> Option<Placement> {
        let kept = |held: &[LlamaToken]| if self.enabled { shared_start(held, prompt) } else { 0 };
        let in_slot = |seq: i32| {
            if self.adapter(seq) == adapter {
                kept(self.slot(seq))
            } else {
                0
            }
        };
        let (best_free, in_slot) = free
            .iter()
            .map(|&seq| (seq, in_slot(seq)))
            // Ties go to the lowest sequence id: running sequences then stay consecutive, which
            // is what lets llama.cpp decode them in one micro-batch (see `Scheduler::by_sequence`).
            .max_by_key(|&(seq, kept)| (kept, std::cmp::Reverse(self.slot(seq).len()), std::cmp::Reverse(seq)))?;
        let from_running = running
            .map(|(seq, held)| (seq, kept(held)))
            .max_by_key(|&(_, kept)| kept);
        match from_running {
            Some((source, reused)) if reused > in_slot && reused >= MIN_COPY => {
                // The free slot whose own tokens are worth least to others.
                let seq = self.least_worth(free)?;
                Some(Placement {
                    seq,
                    reused,
                    copy_from: Some(source),
                })
            }
            _ => Some(Placement {
                seq: best_free,
                reused: in_slot,
                copy_from: None,
            }),
        }
    }

    /// Keeps the tokens a finished sequence leaves in its slot (when reuse is on), computed
    /// under `adapter`.
    pub fn keep(&mut self, seq: i32, tokens: Vec<LlamaToken>, adapter: Adapter) {
        let Ok(index) = usize::try_from(seq) else { return };
        if let (Some(slot), Some(under)) = (self.slots.get_mut(index), self.adapters.get_mut(index)) {
            *slot = if self.enabled { tokens } else { Vec::new() };
            *under = adapter;
        }
    }

    pub fn forget(&mut self, seq: i32) {
        self.keep(seq, Vec::new(), None);
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Cells the free slots hold.
    pub fn cells(&self) -> usize {
        self.slots.iter().map(Vec::len).sum()
    }

    /// The free slot (other than `except`) holding the most cells, to give up for room.
    pub fn largest(&self, except: i32) -> Option<i32> {
        (0..self.slots.len())
            .filter_map(|index| i32::try_from(index).ok())
            .filter(|&seq| seq != except && !self.slot(seq).is_empty())
            .max_by_key(|&seq| self.slot(seq).len())
    }
}

#[cfg(test)]
mod tests {
    use llama_cpp_4::token::LlamaToken;

    use super::{Placement, PrefixCache};

    fn tokens(ids: &[i32]) -> Vec<LlamaToken> {
        ids.iter().copied().map(LlamaToken::new).collect()
    }

    #[test]
    fn ties_go_to_the_lowest_sequence_id_in_any_free_order() {
        let mut cache = PrefixCache::new(true, 4);
        for seq in 0..4 {
            cache.keep(seq, tokens(&[1, 2, 3]), None);
        }
        let prompt = tokens(&[1, 2, 7]);
        for free in [[3, 2, 1, 0], [0, 1, 2, 3], [2, 0, 3, 1]] {
            let placed = cache.place(&free, std::iter::empty(), &prompt, None);
            assert_eq!(placed.map(|placement| placement.seq), Some(0));
        }
        let empty = PrefixCache::new(false, 4);
        assert_eq!(
            empty
                .place(&[3, 1, 2], std::iter::empty(), &prompt, None)
                .map(|p| p.seq),
            Some(1)
        );
    }

    #[test]
    fn the_slot_with_the_longest_shared_start_is_taken() {
        let mut cache = PrefixCache::new(true, 3);
        cache.keep(0, tokens(&[1, 2, 9]), None);
        cache.keep(1, tokens(&[1, 2, 3, 4, 5]), None);
        let prompt = tokens(&[1, 2, 3, 4, 5]);
        let placed = cache.place(&[0, 1, 2], std::iter::empty(), &prompt, None);
        // The whole prompt is cached, but its last token is read again for its logits.
        assert_eq!(
            placed,
            Some(Placement {
                seq: 1,
                reused: 4,
                copy_from: None
            })
        );
        let running: Vec<LlamaToken> = (0..100).map(LlamaToken::new).collect();
        let longer: Vec<LlamaToken> = (0..101).map(LlamaToken::new).collect();
        let placed = cache.place(&[0, 2], [(1, running.as_slice())].into_iter(), &longer, None);
        let copied = Placement {
            seq: 2,
            reused: 100,
            copy_from: Some(1),
        };
        assert_eq!(placed, Some(copied));
        // Too short a start to be worth a copy: the prompt is read.
        let short = tokens(&[1, 2, 3, 4, 5, 6]);
        let placed = cache.place(
            &[2],
            [(1, short.as_slice())].into_iter(),
            &tokens(&[1, 2, 3, 4, 5, 6, 7]),
            None,
        );
        assert_eq!(placed.map(|placement| placement.copy_from), Some(None));
        assert_eq!(cache.place(&[], std::iter::empty(), &prompt, None), None);
    }

    #[test]
    fn cells_computed_under_another_adapter_scale_are_not_reused() {
        let mut cache = PrefixCache::new(true, 2);
        let (full, half) = (Some(1.0f32.to_bits()), Some(0.5f32.to_bits()));
        cache.keep(0, tokens(&[1, 2, 3, 4]), full);
        let prompt = tokens(&[1, 2, 3, 4, 5]);
        assert_eq!(
            cache
                .place(&[0, 1], std::iter::empty(), &prompt, full)
                .map(|p| p.reused),
            Some(4)
        );
        let elsewhere = cache.place(&[0, 1], std::iter::empty(), &prompt, half);
        assert_eq!(elsewhere.map(|p| p.reused), Some(0));
        assert_eq!(cache.adapter(0), full);
    }

    #[test]
    fn nothing_is_reused_when_disabled() {
        let mut cache = PrefixCache::new(false, 2);
        cache.keep(0, tokens(&[1, 2, 3]), None);
        assert_eq!(cache.cells(), 0);
        let placed = cache.place(&[0, 1], std::iter::empty(), &tokens(&[1, 2, 3, 4]), None);
        assert_eq!(placed.map(|placement| placement.reused), Some(0));
    }
}
