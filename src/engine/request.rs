//! A request's side shared by the engine thread (which writes pieces and the outcome) and by
//! Python (which waits for them: blocking with the GIL released, or from asyncio through a
//! `_Waker`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;

use super::waker::{PyWaker, WakePipe};
use super::EngineShared;
use crate::errors::Error;

/// How often a blocked wait looks for Ctrl-C (Python runs signal handlers only between waits).
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Why a request unfinished at a fork cannot be awaited in the child.
const FORKED_REQUEST: &str = "this request was submitted in the parent of this forked process, where its engine \
                              thread stays; it will never finish here";

/// A finished request: its text and tokens, why it ended, what it cost.
#[pyclass(frozen, module = "llamactx", name = "Completion", get_all)]
#[derive(Debug, Clone)]
pub struct PyCompletion {
    /// The generated text (stop strings excluded).
    pub text: String,
    /// The generated token ids (an end-of-generation token excluded).
    pub tokens: Vec<i32>,
    /// Per generated token when `logprobs` was asked for: `(token, log-probability)` of that
    /// token, then of the most likely others, under the model's own distribution.
    pub logprobs: TokenLogprobs,
    /// "stop" (end of generation or a stop string), "length" (`max_tokens` or the context
    /// size), "cancelled".
    pub finish_reason: &'static str,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was reused instead of computed.
    pub cached_tokens: usize,
    /// Tokens sampled (an end-of-generation token included).
    pub completion_tokens: usize,
    /// Tokens proposed by speculative drafts and verified (0 without speculation).
    pub drafted_tokens: usize,
    /// Drafted tokens that were what the model sampled: each saved a decode.
    pub accepted_tokens: usize,
    /// Seconds from `submit` until the engine took the request.
    pub queue_seconds: f64,
    /// Seconds from `submit` until the first token was sampled (None if none was).
    pub first_token_seconds: Option<f64>,
    /// Sampled tokens per second, from the first token to the last.
    pub tokens_per_second: f64,
}

#[pymethods]
impl PyCompletion {
    fn __repr__(&self) -> String {
        format!(
            "<Completion finish_reason={:?} completion_tokens={} text={:?}>",
            self.finish_reason, self.completion_tokens, self.text
        )
    }
}

enum Outcome {
    Done(PyCompletion),
    /// A failure not yet turned into a Python exception (that needs the GIL).
    Failed(Error),
    Raised(PyErr),
}

/// Log-probabilities of generated tokens: per token, `(token, log-probability)` of that token,
/// then of the most likely others.
pub type TokenLogprobs = Vec<Vec<(i32, f32)>>;

/// Text ready for the reader, with the log-probabilities (when asked for) of the tokens
/// sampled since the previous piece.
type Piece = (String, TokenLogprobs);

#[derive(Default)]
struct Progress {
    pieces: VecDeque<Piece>,
    outcome: Option<Outcome>,
}

/// What the engine thread and the waiting Python code share of one request.
pub struct RequestShared {
    progress: Mutex<Progress>,
    /// Signalled for every piece and at the end.
    changed: Condvar,
    /// Signalled at the end only: a thread waiting for the result is not woken per token (on
    /// 2 CPUs each wake-up stalled the engine's compute threads measurably).
    ended: Condvar,
    cancelled: AtomicBool,
    /// The pipes of the event loops that await this request, one per loop. Weak: a loop's
    /// pipe closes with its loop, whatever requests it once awaited; while a byte is written
    /// the upgraded pipe is held open, so its descriptor number cannot be reused meanwhile.
    wakers: Mutex<Vec<Weak<WakePipe>>>,
    /// Whether a watching loop wants a wake-up per piece (`async for`), not just at the end.
    wake_on_pieces: AtomicBool,
    engine: Arc<EngineShared>,
    /// The process that submitted the request: its engine thread exists only there.
    pid: u32,
}

impl RequestShared {
    pub(crate) fn new(engine: Arc<EngineShared>) -> Self {
        Self {
            progress: Mutex::default(),
            changed: Condvar::new(),
            ended: Condvar::new(),
            cancelled: AtomicBool::new(false),
            wakers: Mutex::default(),
            wake_on_pieces: AtomicBool::new(false),
            engine,
            pid: std::process::id(),
        }
    }

    fn progress(&self) -> MutexGuard<'_, Progress> {
        // Pieces and outcome stay consistent whatever panicked while holding the lock.
        self.progress.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn wakers(&self) -> MutexGuard<'_, Vec<Weak<WakePipe>>> {
        self.wakers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn notify(&self, end: bool) {
        self.changed.notify_all();
        if end {
            self.ended.notify_all();
        } else if !self.wake_on_pieces.load(Ordering::Acquire) {
            return;
        }
        for pipe in self.wakers().iter().filter_map(Weak::upgrade) {
            pipe.wake();
        }
    }

    /// Hands a piece of text to the reader, with the log-probabilities of the tokens sampled
    /// since the previous piece.
    pub(crate) fn emit(&self, text: String, logprobs: TokenLogprobs) {
        self.progress().pieces.push_back((text, logprobs));
        self.notify(false);
    }

    /// Ends the request (the first outcome wins).
    pub(crate) fn complete(&self, completion: PyCompletion) {
        self.settle(Outcome::Done(completion));
    }

    pub(crate) fn fail(&self, error: Error) {
        self.settle(Outcome::Failed(error));
    }

    fn settle(&self, outcome: Outcome) {
        self.progress().outcome.get_or_insert(outcome);
        self.notify(true);
    }

    pub fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.engine.wake_scheduler();
    }

    fn finished(&self) -> bool {
        self.progress().outcome.is_some()
    }

    /// Waits for the next piece of text (a Rust caller's reading: it holds no GIL); None once
    /// the request is over, which `ended` then tells.
    pub fn next_text(&self) -> Option<String> {
        let mut progress = self.progress();
        loop {
            if let Some((text, _)) = progress.pieces.pop_front() {
                return Some(text);
            }
            if progress.outcome.is_some() {
                return None;
            }
            progress = self
                .changed
                .wait(progress)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// The completion, or the failure's message, once the request ended.
    pub fn ended(&self) -> Option<std::result::Result<PyCompletion, String>> {
        match &self.progress().outcome {
            None => None,
            Some(Outcome::Done(completion)) => Some(Ok(completion.clone())),
            Some(Outcome::Failed(err)) => Some(Err(format!("{err:?}"))),
            Some(Outcome::Raised(err)) => Some(Err(err.to_string())),
        }
    }

    /// In a forked child: whether the request had ended. A lock the engine thread held at the
    /// fork stays held in the child, so it is tried, never awaited.
    fn ended_before_a_fork(&self) -> bool {
        self.progress
            .try_lock()
            .is_ok_and(|progress| progress.outcome.is_some())
    }
}

/// What a reader waits for.
#[derive(Clone, Copy)]
enum Want {
    /// The next piece, or the end.
    Piece,
    /// The end.
    End,
}

fn ready(progress: &Progress, want: Want) -> bool {
    progress.outcome.is_some() || (matches!(want, Want::Piece) && !progress.pieces.is_empty())
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
            .transpose()?;
        self.refuse_in_a_forked_child()?;
        loop {
            let done = py.detach(|| {
                let progress = self.shared.progress();
                let slice = deadline.map_or(SIGNAL_CHECK, |deadline| {
                    SIGNAL_CHECK.min(deadline.saturating_duration_since(Instant::now()))
                });
                let signal = match want {
                    Want::Piece => &self.shared.changed,
                    Want::End => &self.shared.ended,
                };
                let (progress, _) = signal
                    .wait_timeout_while(progress, slice, |progress| !ready(progress, want))
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                ready(&progress, want)
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

    /// `ValueError` in a forked child for a request that had not ended: the engine thread that
    /// would end it stayed in the parent, so waiting would never return.
    fn refuse_in_a_forked_child(&self) -> PyResult<()> {
        if std::process::id() != self.shared.pid && !self.shared.ended_before_a_fork() {
            return Err(Error::value(FORKED_REQUEST).into());
        }
        Ok(())
    }

    /// The outcome as a Python value: the completion, or the failure raised (every time).
    fn outcome(&self, py: Python<'_>) -> PyResult<Option<PyCompletion>> {
        let mut progress = self.shared.progress();
        let raised = match progress.outcome.take() {
            None => return Ok(None),
            Some(Outcome::Done(completion)) => {
                progress.outcome = Some(Outcome::Done(completion.clone()));
                return Ok(Some(completion));
            }
            Some(Outcome::Failed(error)) => PyErr::from(error),
            Some(Outcome::Raised(raised)) => raised,
        };
        progress.outcome = Some(Outcome::Raised(raised.clone_ref(py)));
        Err(raised)
    }

    /// The next piece, the end (raising the failure, if it failed), or nothing yet: another
    /// reader of the same request may have taken the piece a wait saw.
    fn take(&self, py: Python<'_>) -> PyResult<Taken> {
        let mut progress = self.shared.progress();
        if let Some(piece) = progress.pieces.pop_front() {
            return Ok(Taken::Piece(piece));
        }
        if progress.outcome.is_none() {
            return Ok(Taken::Nothing);
        }
        drop(progress);
        self.outcome(py).map(|_| Taken::End)
    }
}

/// What a reader found.
enum Taken {
    Piece(Piece),
    End,
    Nothing,
}

#[pymethods]
impl PyRequestCore {
    /// The next piece, `(text, logprobs of its tokens)`; None once the request is over (its
    /// failure is raised then). Blocks with the GIL released.
    fn next_piece(&self, py: Python<'_>) -> PyResult<Option<Piece>> {
        loop {
            self.wait(py, Want::Piece, None)?;
            match self.take(py)? {
                Taken::Piece(piece) => return Ok(Some(piece)),
                Taken::End => return Ok(None),
                Taken::Nothing => {}
            }
        }
    }

    /// `("piece", (text, logprobs))`, `("end", None)` or `("wait", None)`, without blocking.
    fn poll(&self, py: Python<'_>) -> PyResult<(&'static str, Option<Piece>)> {
        self.refuse_in_a_forked_child()?;
        Ok(match self.take(py)? {
            Taken::Piece(piece) => ("piece", Some(piece)),
            Taken::End => ("end", None),
            Taken::Nothing => ("wait", None),
        })
    }

    /// The `Completion`, waiting up to `timeout` seconds (None: no limit) with the GIL
    /// released; the failure is raised if the request failed, `TimeoutError` after `timeout`.
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyCompletion> {
        self.wait(py, Want::End, timeout)?;
        self.outcome(py)?
            .ok_or_else(|| Error::Runtime("the request ended without an outcome".to_owned()).into())
    }

    /// The `Completion` if the request is over (raising its failure), else None.
    fn result_now(&self, py: Python<'_>) -> PyResult<Option<PyCompletion>> {
        self.refuse_in_a_forked_child()?;
        self.outcome(py)
    }

    /// Whether the awaited news is there: a piece or the end (`end_only`: the end).
    fn ready(&self, end_only: bool) -> bool {
        ready(&self.shared.progress(), if end_only { Want::End } else { Want::Piece })
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
        if pieces {
            self.shared.wake_on_pieces.store(true, Ordering::Release);
        }
        let mut wakers = self.shared.wakers();
        wakers.retain(|watching| watching.strong_count() > 0);
        if !wakers
            .iter()
            .any(|watching| std::ptr::eq(watching.as_ptr(), Arc::as_ptr(&waker.pipe)))
        {
            wakers.push(Arc::downgrade(&waker.pipe));
        }
    }
}
