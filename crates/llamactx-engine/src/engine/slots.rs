//! A sequence slot's cached KV cells, saved and restored while the engine runs (llama-server's
//! `/slots/{id}?action=save|restore|erase`, and prompt caches kept on disk). The engine thread,
//! which owns the context, does each such chore between steps, on a slot no request holds: a
//! chore on a running sequence waits for it to end. A saved slot is llama.cpp's sequence state
//! file (`llama_state_seq_save_file`'s bytes): the tokens the prefix cache keeps for the slot,
//! then its cells.

use std::sync::mpsc::{channel, Receiver, Sender};

use super::Engine;
use crate::errors::{Error, Result};

/// What the engine thread is asked to do to a slot, and where its answer goes.
pub enum SlotChore {
    /// Sequence `seq`'s file; with None, the file of every free slot holding cached tokens.
    Save {
        seq: Option<i32>,
        reply: Sender<Result<Vec<Vec<u8>>>>,
    },
    /// A file restored into `seq`, or into the free slot whose cache is worth least (None):
    /// answers the slot and the tokens it now holds.
    Restore {
        seq: Option<i32>,
        file: Vec<u8>,
        reply: Sender<Result<(i32, usize)>>,
    },
    /// Empties `seq`: answers the tokens it held.
    Erase { seq: i32, reply: Sender<Result<usize>> },
    /// Every slot: whether a request holds it, and the tokens in its cells.
    List {
        reply: Sender<Result<Vec<(i32, bool, usize)>>>,
    },
}

impl SlotChore {
    /// The sequence the chore must wait for, if it names one.
    pub fn seq(&self) -> Option<i32> {
        match self {
            Self::Save { seq, .. } | Self::Restore { seq, .. } => *seq,
            Self::Erase { seq, .. } => Some(*seq),
            Self::List { .. } => None,
        }
    }

    /// Answers that the engine stopped before doing the chore.
    pub fn abandon(self) {
        let closed = || Error::closed("Engine");
        // A caller that stopped waiting has nothing to be told.
        let _ = match self {
            Self::Save { reply, .. } => reply.send(Err(closed())).is_ok(),
            Self::Restore { reply, .. } => reply.send(Err(closed())).is_ok(),
            Self::Erase { reply, .. } => reply.send(Err(closed())).is_ok(),
            Self::List { reply } => reply.send(Err(closed())).is_ok(),
        };
    }
}

impl Engine {
    /// Slot `seq` as the engine's sequence number: `IndexError` unless it is one of them.
    pub fn slot(&self, seq: i64) -> Result<i32> {
        i32::try_from(seq)
            .ok()
            .filter(|&seq| u32::try_from(seq).is_ok_and(|seq| seq < self.n_seq_max))
            .ok_or_else(|| Error::index(format!("slot {seq} is not one of the engine's 0..{}", self.n_seq_max)))
    }

    /// Hands the engine thread the chore `make` builds; its answer comes through the receiver
    /// (the thread answers every chore, also those it leaves when it stops).
    pub fn send_chore<T>(&self, make: impl FnOnce(Sender<Result<T>>) -> SlotChore) -> Result<Receiver<Result<T>>> {
        let (reply, answer) = channel();
        {
            let mut inbox = self.shared.inbox();
            if inbox.closed {
                return Err(Error::closed("Engine"));
            }
            inbox.chores.push_back(make(reply));
        }
        self.shared.wake_scheduler();
        Ok(answer)
    }
}
