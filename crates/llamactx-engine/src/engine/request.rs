//! A request's side shared by the engine thread (which writes pieces and the outcome) and by
//! its readers: a Rust thread (`next_text`), or Python (`python.rs`: blocking with the GIL
//! released, or from asyncio through a `WakePipe`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::wake_pipe::WakePipe;
use super::EngineShared;
use crate::errors::{Error, Result};

/// Why a request unfinished at a fork cannot be awaited in the child.
const FORKED_REQUEST: &str = "this request was submitted in the parent of this forked process, where its engine \
                              thread stays; it will never finish here";

/// Declares `Completion`'s fields once: the struct below, and the getters of the Python class
/// (`python.rs`).
#[macro_export]
macro_rules! completion_fields {
    ($declare:ident) => {
        $declare! {
            /// The generated text (stop strings excluded).
            text: String,
            /// The generated token ids (an end-of-generation token excluded).
            tokens: Vec<i32>,
            /// Per generated token when `logprobs` was asked for: `(token, log-probability)` of that
            /// token, then of the most likely others, under the model's own distribution.
            logprobs: $crate::engine::request::TokenLogprobs,
            /// "stop" (end of generation or a stop string), "length" (`max_tokens` or the context
            /// size), "cancelled".
            finish_reason: &'static str,
            /// Tokens of the prompt.
            prompt_tokens: usize,
            /// Prompt tokens whose KV was reused instead of computed.
            cached_tokens: usize,
            /// Tokens sampled (an end-of-generation token included).
            completion_tokens: usize,
            /// Tokens proposed by speculative drafts and verified (0 without speculation).
            drafted_tokens: usize,
            /// Drafted tokens that were what the model sampled: each saved a decode.
            accepted_tokens: usize,
            /// Seconds from `submit` until the engine took the request.
            queue_seconds: f64,
            /// Seconds from `submit` until the first token was sampled (None if none was).
            first_token_seconds: Option<f64>,
            /// Sampled tokens per second, from the first token to the last.
            tokens_per_second: f64,
        }
    };
}

macro_rules! declare_completion {
    ($($(#[doc = $doc:literal])* $name:ident: $kept:ty,)*) => {
        /// A finished request: its text and tokens, why it ended, what it cost.
        #[derive(Debug, Clone)]
        pub struct Completion {
            $($(#[doc = $doc])* pub $name: $kept,)*
        }
    };
}
completion_fields!(declare_completion);

/// How a request ended.
pub enum Outcome {
    Done(Completion),
    Failed(Error),
}

/// Log-probabilities of generated tokens: per token, `(token, log-probability)` of that token,
/// then of the most likely others.
pub type TokenLogprobs = Vec<Vec<(i32, f32)>>;

/// Text ready for the reader, with the log-probabilities (when asked for) of the tokens
/// sampled since the previous piece.
pub type Piece = (String, TokenLogprobs);

#[derive(Default)]
struct Progress {
    pieces: VecDeque<Piece>,
    outcome: Option<Outcome>,
}

/// What a reader waits for.
#[derive(Clone, Copy)]
pub enum Want {
    /// The next piece, or the end.
    Piece,
    /// The end.
    End,
}

/// What a reader finds: the next piece, the end (every piece read), or nothing yet.
pub enum Next {
    Piece(Piece),
    Ended,
    Pending,
}

fn ready(progress: &Progress, want: Want) -> bool {
    progress.outcome.is_some() || (matches!(want, Want::Piece) && !progress.pieces.is_empty())
}

/// What the engine thread and the request's readers share of one request.
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
    pub fn new(engine: Arc<EngineShared>) -> Self {
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
    pub fn emit(&self, text: String, logprobs: TokenLogprobs) {
        self.progress().pieces.push_back((text, logprobs));
        self.notify(false);
    }

    /// Ends the request (the first outcome wins).
    pub fn complete(&self, completion: Completion) {
        self.settle(Outcome::Done(completion));
    }

    pub fn fail(&self, error: Error) {
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

    /// Whether the request is over.
    pub fn finished(&self) -> bool {
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
    pub fn ended(&self) -> Option<std::result::Result<Completion, String>> {
        match &self.progress().outcome {
            None => None,
            Some(Outcome::Done(completion)) => Some(Ok(completion.clone())),
            Some(Outcome::Failed(err)) => Some(Err(format!("{err:?}"))),
        }
    }

    /// In a forked child: whether the request had ended. A lock the engine thread held at the
    /// fork stays held in the child, so it is tried, never awaited.
    fn ended_before_a_fork(&self) -> bool {
        self.progress
            .try_lock()
            .is_ok_and(|progress| progress.outcome.is_some())
    }

    /// Refuses to wait in a forked child for a request that had not ended: the engine thread
    /// that would end it stayed in the parent, so waiting would never return.
    ///
    /// # Errors
    ///
    /// `Error::Value` in such a child.
    pub fn refuse_in_a_forked_child(&self) -> Result<()> {
        if std::process::id() != self.pid && !self.ended_before_a_fork() {
            return Err(Error::value(FORKED_REQUEST));
        }
        Ok(())
    }

    /// Waits at most `slice` until `want` is ready; whether it is.
    pub fn wait_for(&self, want: Want, slice: Duration) -> bool {
        let signal = match want {
            Want::Piece => &self.changed,
            Want::End => &self.ended,
        };
        let (progress, _) = signal
            .wait_timeout_while(self.progress(), slice, |progress| !ready(progress, want))
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ready(&progress, want)
    }

    /// Whether `want` is ready now.
    pub fn is_ready(&self, want: Want) -> bool {
        ready(&self.progress(), want)
    }

    /// The oldest piece not yet read, else whether the request ended.
    pub fn next(&self) -> Next {
        let mut progress = self.progress();
        match progress.pieces.pop_front() {
            Some(piece) => Next::Piece(piece),
            None if progress.outcome.is_some() => Next::Ended,
            None => Next::Pending,
        }
    }

    /// Reads or replaces the outcome under the request's lock (None: not ended yet).
    pub fn with_outcome<T>(&self, read: impl FnOnce(&mut Option<Outcome>) -> T) -> T {
        read(&mut self.progress().outcome)
    }

    /// Wakes `pipe` at the end, and on every piece from now on if `pieces`; every pipe that
    /// watches is woken.
    pub fn watch(&self, pipe: &Arc<WakePipe>, pieces: bool) {
        if pieces {
            self.wake_on_pieces.store(true, Ordering::Release);
        }
        let mut wakers = self.wakers();
        wakers.retain(|watching| watching.strong_count() > 0);
        if !wakers
            .iter()
            .any(|watching| std::ptr::eq(watching.as_ptr(), Arc::as_ptr(pipe)))
        {
            wakers.push(Arc::downgrade(pipe));
        }
    }
}
