//! `LlamaBatch`: a `BatchState` behind a lock, for Python.

use pyo3::prelude::*;

use super::BatchState;
use crate::errors::python::to_py;
use crate::errors::{Error, Result};
use crate::gil::detached;
use crate::owned_lock::{OwnedGuard, OwnedMutex};
use crate::tokens::python::extract_token_ids;

/// A batch of tokens for `LlamaContext.decode`/`encode`: `LlamaBatch(n_tokens, n_seq_max=1)`
/// holds up to `n_tokens` tokens, each in up to `n_seq_max` sequences.
#[pyclass(frozen, module = "llamactx", name = "LlamaBatch")]
pub struct PyLlamaBatch {
    pub state: OwnedMutex<BatchState>,
}

impl PyLlamaBatch {
    pub fn lock(&self) -> Result<OwnedGuard<'_, BatchState>> {
        self.state.lock()
    }

    /// Runs `work` on the batch with the GIL released: a decode holds the batch's lock while
    /// its abort callback may need the GIL, so waiting for the lock with the GIL would deadlock.
    fn with_state<T: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut BatchState) -> Result<T> + Send,
    ) -> PyResult<T> {
        detached(py, || work(&mut *self.lock()?))
    }
}

#[pymethods]
impl PyLlamaBatch {
    #[new]
    #[pyo3(signature = (n_tokens, n_seq_max=1))]
    fn new(n_tokens: usize, n_seq_max: usize) -> PyResult<Self> {
        Ok(Self {
            state: OwnedMutex::new(BatchState::new(n_tokens, n_seq_max).map_err(to_py)?, "LlamaBatch"),
        })
    }

    /// Appends one token at position `pos` of each sequence in `seq_ids`; `logits` asks for
    /// its output row. Raises `BatchAddError` when the batch is full.
    fn add(&self, py: Python<'_>, token: i64, pos: i64, seq_ids: Vec<i64>, logits: bool) -> PyResult<()> {
        let narrow = |what: &str, value: i64| {
            i32::try_from(value).map_err(|_| Error::value(format!("{what} {value} is out of range")))
        };
        let seq_ids = seq_ids
            .into_iter()
            .map(|id| narrow("sequence id", id))
            .collect::<Result<Vec<_>>>()
            .map_err(to_py)?;
        let (token, pos) = (
            narrow("token id", token).map_err(to_py)?,
            narrow("position", pos).map_err(to_py)?,
        );
        self.with_state(py, |state| state.add(token, pos, &seq_ids, logits))
    }

    /// Appends `tokens` to sequence `seq_id` at positions 0, 1, ...; the last token always
    /// gets logits, the others when `logits_all`.
    fn add_sequence(&self, py: Python<'_>, tokens: &Bound<'_, PyAny>, seq_id: i32, logits_all: bool) -> PyResult<()> {
        let ids = extract_token_ids(tokens)?;
        self.with_state(py, |state| state.add_sequence(&ids, seq_id, logits_all))
    }

    /// Empties the batch (its allocation is kept).
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        self.with_state(py, |state| {
            state.clear();
            Ok(())
        })
    }

    /// Number of tokens in the batch.
    fn n_tokens(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_state(py, |state| Ok(state.tokens.len()))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.n_tokens(py)
    }

    fn __repr__(&self) -> String {
        match self.state.try_lock() {
            Ok(Some(state)) => format!("<LlamaBatch {}/{} tokens>", state.tokens.len(), state.capacity()),
            Ok(None) => "<LlamaBatch (busy)>".to_owned(),
            Err(_) => "<LlamaBatch (poisoned)>".to_owned(),
        }
    }
}
