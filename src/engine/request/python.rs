//! The Python side of a request: `Completion`, `_RequestCore` (wrapped by `llamactx.Request`),
//! which waits with the GIL released and checks for Ctrl-C between waits, and `_Waker`, the
//! pipe an asyncio loop watches for news of the requests it awaits (one per loop).

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;

use llamactx_engine::completion_fields;

use super::{Completion, Next, Outcome, Piece, RequestShared, Want};
use crate::engine::wake_pipe::WakePipe;
use crate::errors::python::{foreign, to_py};
use crate::errors::Error;

/// How often a blocked wait looks for Ctrl-C (Python runs signal handlers only between waits).
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// A finished request: its text and tokens, why it ended, what it cost.
#[pyclass(frozen, module = "llamactx", name = "Completion")]
#[derive(Debug, Clone)]
pub struct PyCompletion(pub Completion);

macro_rules! completion_getters {
    ($($(#[doc = $doc:literal])* $name:ident: $kept:ty,)*) => {
        #[pymethods]
        impl PyCompletion {
            $(
                $(#[doc = $doc])*
                #[getter]
                fn $name(&self) -> $kept {
                    self.0.$name.clone()
                }
            )*
        }
    };
}
completion_fields!(completion_getters);

#[pymethods]
impl PyCompletion {
    fn __repr__(&self) -> String {
        let completion = &self.0;
        format!(
            "<Completion finish_reason={:?} completion_tokens={} text={:?}>",
            completion.finish_reason, completion.completion_tokens, completion.text
        )
    }
}

/// The Python handle of one request (wrapped by `llamactx.Request`).
#[pyclass(frozen, module = "llamactx", name = "_RequestCore")]
pub struct PyRequestCore {
    pub shared: Arc<RequestShared>,
}

impl PyRequestCore {
    /// Waits, with the GIL released, until `want` is ready or `timeout` (seconds) passes;
    /// checks for Ctrl-C in between (a wait it interrupts cancels the request).
    fn wait(&self, py: Python<'_>, want: Want, timeout: Option<f64>) -> PyResult<()> {
        let deadline = timeout
            .map(|seconds| {
                Duration::try_from_secs_f64(seconds)
                    .map(|wait| Instant::now() + wait)
                    .map_err(|_| Error::value(format!("timeout must be a number of seconds >= 0, got {seconds}")))
            })
            .transpose()
            .map_err(to_py)?;
        self.shared.refuse_in_a_forked_child().map_err(to_py)?;
        loop {
            let done = py.detach(|| {
                let slice = deadline.map_or(SIGNAL_CHECK, |deadline| {
                    SIGNAL_CHECK.min(deadline.saturating_duration_since(Instant::now()))
                });
                self.shared.wait_for(want, slice)
            });
            if done {
                return Ok(());
            }
            if let Err(interrupt) = py.check_signals() {
                self.shared.cancel();
                return Err(interrupt);
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Err(PyTimeoutError::new_err("the request has not finished yet"));
            }
        }
    }

    /// The outcome as a Python value: the completion, or the failure raised (every time: the
    /// exception raised is kept in its place, so each reader gets the same one).
    fn outcome(&self, py: Python<'_>) -> PyResult<Option<PyCompletion>> {
        self.shared.with_outcome(|outcome| match outcome.take() {
            None => Ok(None),
            Some(Outcome::Done(completion)) => {
                *outcome = Some(Outcome::Done(completion.clone()));
                Ok(Some(PyCompletion(completion)))
            }
            Some(Outcome::Failed(error)) => {
                let raised = to_py(error);
                *outcome = Some(Outcome::Failed(foreign(raised.clone_ref(py))));
                Err(raised)
            }
        })
    }

    /// The next piece, the end (raising the failure, if it failed), or nothing yet: another
    /// reader of the same request may have taken the piece a wait saw.
    fn take(&self, py: Python<'_>) -> PyResult<Next> {
        let next = self.shared.next();
        if matches!(next, Next::Ended) {
            self.outcome(py)?;
        }
        Ok(next)
    }
}

#[pymethods]
impl PyRequestCore {
    /// The next piece, `(text, logprobs of its tokens)`; None once the request is over (its
    /// failure is raised then). Blocks with the GIL released.
    fn next_piece(&self, py: Python<'_>) -> PyResult<Option<Piece>> {
        loop {
            self.wait(py, Want::Piece, None)?;
            match self.take(py)? {
                Next::Piece(piece) => return Ok(Some(piece)),
                Next::Ended => return Ok(None),
                Next::Pending => {}
            }
        }
    }

    /// `("piece", (text, logprobs))`, `("end", None)` or `("wait", None)`, without blocking.
    fn poll(&self, py: Python<'_>) -> PyResult<(&'static str, Option<Piece>)> {
        self.shared.refuse_in_a_forked_child().map_err(to_py)?;
        Ok(match self.take(py)? {
            Next::Piece(piece) => ("piece", Some(piece)),
            Next::Ended => ("end", None),
            Next::Pending => ("wait", None),
        })
    }

    /// The `Completion`, waiting up to `timeout` seconds (None: no limit) with the GIL
    /// released; the failure is raised if the request failed, `TimeoutError` after `timeout`.
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyCompletion> {
        self.wait(py, Want::End, timeout)?;
        self.outcome(py)?
            .ok_or_else(|| to_py(Error::Runtime("the request ended without an outcome".to_owned())))
    }

    /// The `Completion` if the request is over (raising its failure), else None.
    fn result_now(&self, py: Python<'_>) -> PyResult<Option<PyCompletion>> {
        self.shared.refuse_in_a_forked_child().map_err(to_py)?;
        self.outcome(py)
    }

    /// Whether the awaited news is there: a piece or the end (`end_only`: the end).
    fn ready(&self, end_only: bool) -> bool {
        self.shared.is_ready(if end_only { Want::End } else { Want::Piece })
    }

    /// Asks the engine to stop the request at its next step.
    fn cancel(&self) {
        self.shared.cancel();
    }

    /// Whether the request is over.
    #[getter]
    fn done(&self) -> bool {
        self.shared.finished()
    }

    /// Wakes `waker`'s loop at the end, and on every piece from now on if `pieces`; every
    /// loop that watches is woken.
    fn watch(&self, waker: &PyWaker, pieces: bool) {
        self.shared.watch(&waker.pipe, pieces);
    }
}

/// The pipe an asyncio loop watches for news of the requests it awaits (one per loop).
#[pyclass(frozen, module = "llamactx", name = "_Waker")]
pub struct PyWaker {
    pub pipe: Arc<WakePipe>,
}

#[pymethods]
impl PyWaker {
    #[new]
    fn new() -> PyResult<Self> {
        let pipe = WakePipe::new().map_err(|err| to_py(Error::Runtime(format!("could not create a pipe: {err}"))))?;
        Ok(Self { pipe: Arc::new(pipe) })
    }

    /// The descriptor to watch for reading.
    fn fileno(&self) -> RawFd {
        self.pipe.fileno()
    }

    /// Empties the pipe (after it woke the loop).
    fn drain(&self) {
        self.pipe.drain();
    }
}
