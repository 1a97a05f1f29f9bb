//! A sequence slot's cached KV cells, saved and restored while the engine runs (llama-server's
//! `/slots/{id}?action=save|restore|erase`, and prompt caches kept on disk). The engine thread,
//! which owns the context, does each such chore between steps, on a slot no request holds: a
//! chore on a running sequence waits for it to end. A saved slot is llama.cpp's sequence state
//! file (`llama_state_seq_save_file`'s bytes): the tokens the prefix cache keeps for the slot,
//! then its cells.

use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::PyEngineCore;
use crate::errors::{Error, Result};
use crate::gil::detached;

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

impl PyEngineCore {
    /// `seq` checked against the engine's sequences.
    fn slot(&self, seq: i64) -> Result<i32> {
        i32::try_from(seq)
            .ok()
            .filter(|&seq| u32::try_from(seq).is_ok_and(|seq| seq < self.n_seq_max))
            .ok_or_else(|| Error::index(format!("slot {seq} is not one of the engine's 0..{}", self.n_seq_max)))
    }

    /// Queues the chore `make` builds around its reply channel and waits for the answer,
    /// without the GIL; Ctrl-C stops the wait (not the chore).
    fn chore<T: Send>(&self, py: Python<'_>, make: impl FnOnce(Sender<Result<T>>) -> SlotChore) -> PyResult<T> {
        let (reply, mut answer) = channel();
        {
            let mut inbox = self.shared.inbox();
            if inbox.closed {
                return Err(Error::closed("Engine").into());
            }
            inbox.chores.push_back(make(reply));
        }
        self.shared.wake_scheduler();
        loop {
            // The receiver goes to the detached closure and back (it may be sent, not shared).
            let (got, back) = detached(py, move || {
                Ok((answer.recv_timeout(Duration::from_millis(100)), answer))
            })?;
            answer = back;
            match got {
                Ok(answer) => return Ok(answer?),
                // An engine thread that ended without answering (it answers every chore it
                // leaves when it stops) ended by a fault the engine's own requests report.
                Err(RecvTimeoutError::Timeout) if !self.thread_ended() => py.check_signals()?,
                Err(_) => return Err(Error::closed("Engine").into()),
            }
        }
    }
}

#[pymethods]
impl PyEngineCore {
    /// Slot `seq`'s cached tokens and cells as llama.cpp's sequence state file (what
    /// llama-server's `/slots/{id}?action=save` writes), once no request holds it; with
    /// `seq=None`, the file of every free slot that holds cached tokens.
    #[pyo3(signature = (seq=None))]
    fn save_slots<'py>(&self, py: Python<'py>, seq: Option<i64>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let seq = seq.map(|seq| self.slot(seq)).transpose()?;
        let files = self.chore(py, |reply| SlotChore::Save { seq, reply })?;
        Ok(files.iter().map(|file| PyBytes::new(py, file)).collect())
    }

    /// Restores a sequence state file into slot `seq` (once no request holds it), or into the
    /// free slot whose cache is worth least (`seq=None`), for the prefix cache to reuse; returns
    /// the slot and the number of tokens it holds. `StateError` for a file this context refuses
    /// (the slot is then empty), `ValueError` on an engine without a prefix cache.
    #[pyo3(signature = (file, seq=None))]
    fn restore_slot(&self, py: Python<'_>, file: &[u8], seq: Option<i64>) -> PyResult<(i32, usize)> {
        let seq = seq.map(|seq| self.slot(seq)).transpose()?;
        let file = file.to_vec();
        self.chore(py, |reply| SlotChore::Restore { seq, file, reply })
    }

    /// Every slot as `(slot, busy, tokens)`: whether a request holds it, and the tokens its
    /// cells hold (a request's so far, or those cached for reuse), between two steps.
    fn slots(&self, py: Python<'_>) -> PyResult<Vec<(i32, bool, usize)>> {
        self.chore(py, |reply| SlotChore::List { reply })
    }

    /// Empties slot `seq` (once no request holds it); returns the number of tokens it held.
    fn erase_slot(&self, py: Python<'_>, seq: i64) -> PyResult<usize> {
        let seq = self.slot(seq)?;
        self.chore(py, |reply| SlotChore::Erase { seq, reply })
    }
}
