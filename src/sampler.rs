//! `LlamaSampler`: llama.cpp's token samplers, built with the crate's constructors.

use std::sync::Mutex;

use llama_cpp_4::sampling::LlamaSampler;
use llama_cpp_4::token::LlamaToken;
use pyo3::prelude::*;

use crate::context::PyLlamaContext;
use crate::errors::{shim_error, Error, Result};
use crate::native::detached;

struct SendSampler(LlamaSampler);

// SAFETY: `LlamaSampler` is `!Send` only because it owns a raw `llama_sampler*`. A sampler
// has no thread affinity; it must just not be used by two threads at once, which the
// `Mutex` in `PyLlamaSampler` guarantees.
unsafe impl Send for SendSampler {}

/// A llama.cpp sampler (or chain of samplers) that picks the next token from logits.
#[pyclass(frozen, module = "llamactx", name = "LlamaSampler")]
pub struct PyLlamaSampler {
    sampler: Mutex<SendSampler>,
}

impl PyLlamaSampler {
    fn new(sampler: LlamaSampler) -> Self {
        Self {
            sampler: Mutex::new(SendSampler(sampler)),
        }
    }

    /// Runs `work` on the sampler with the GIL released (a decode may hold it while its
    /// callbacks need the GIL, so it is never awaited with the GIL held).
    fn with_sampler<T: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut LlamaSampler) -> Result<T> + Send,
    ) -> PyResult<T> {
        detached(py, || work(&mut self.lock()?.0))
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, SendSampler>> {
        self.sampler.lock().map_err(|_| Error::Poisoned("LlamaSampler"))
    }
}

fn probability(name: &str, p: f32) -> Result<f32> {
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(Error::value(format!("{name} must be in [0, 1], got {p}")))
    }
}

#[pymethods]
impl PyLlamaSampler {
    /// Always picks the most likely token.
    #[staticmethod]
    fn greedy() -> Self {
        Self::new(LlamaSampler::greedy())
    }

    /// Picks a token at random by its probability, from a generator seeded with `seed`.
    #[staticmethod]
    fn dist(seed: u32) -> Self {
        Self::new(LlamaSampler::dist(seed))
    }

    /// Divides the logits by temperature `t` (`t <= 0` keeps only the most likely token).
    #[staticmethod]
    fn temp(t: f32) -> Self {
        Self::new(LlamaSampler::temp(t))
    }

    /// Keeps the `k` most likely tokens (`k <= 0` keeps all).
    #[staticmethod]
    fn top_k(k: i32) -> Self {
        Self::new(LlamaSampler::top_k(k))
    }

    /// Keeps the most likely tokens whose probabilities add up to `p` (at least `min_keep`).
    #[staticmethod]
    #[pyo3(signature = (p, min_keep=1))]
    fn top_p(p: f32, min_keep: usize) -> PyResult<Self> {
        Ok(Self::new(LlamaSampler::top_p(probability("p", p)?, min_keep)))
    }

    /// Keeps tokens at least `p` times as likely as the most likely one (at least `min_keep`).
    #[staticmethod]
    #[pyo3(signature = (p, min_keep=1))]
    fn min_p(p: f32, min_keep: usize) -> PyResult<Self> {
        Ok(Self::new(LlamaSampler::min_p(probability("p", p)?, min_keep)))
    }

    /// Applies `samplers` in order; the last one must select a token (`greedy` or `dist`).
    /// The chain holds copies: the given samplers stay usable on their own.
    #[staticmethod]
    #[pyo3(signature = (samplers, no_perf=false))]
    fn chain(py: Python<'_>, samplers: Vec<Py<PyLlamaSampler>>, no_perf: bool) -> PyResult<Self> {
        let mut copies = Vec::with_capacity(samplers.len());
        for sampler in &samplers {
            copies.push(
                sampler
                    .get()
                    .with_sampler(py, |sampler| Ok(SendSampler(sampler.clone_sampler())))?,
            );
        }
        Ok(Self::new(LlamaSampler::chain(
            copies.into_iter().map(|copy| copy.0),
            no_perf,
        )))
    }

    /// Samples a token from output row `idx` of `ctx` (negative counts from the last output)
    /// and returns its id. `IndexError` if that row has no logits.
    #[pyo3(signature = (ctx, idx=-1), text_signature = "(self, ctx, idx=-1)")]
    fn sample(&self, py: Python<'_>, ctx: &Bound<'_, PyLlamaContext>, idx: i32) -> PyResult<i32> {
        ctx.get().run(py, |native| {
            let row = native.logit_row(idx)?;
            let sampler = self.lock()?;
            Ok(native
                .with(|context| sampler.0.try_sample(context, row))
                .map_err(shim_error)?
                .0)
        })
    }

    /// Tells the sampler that `token` was chosen (updates penalties, grammar state, ...).
    fn accept(&self, py: Python<'_>, token: i32) -> PyResult<()> {
        if token < 0 {
            return Err(Error::value(format!("token id {token} is negative")).into());
        }
        self.with_sampler(py, |sampler| {
            sampler.try_accept(LlamaToken::new(token)).map_err(shim_error)
        })
    }

    /// Forgets what was accepted so far.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        self.with_sampler(py, |sampler| {
            sampler.reset();
            Ok(())
        })
    }

    /// The sampler's name, e.g. `"greedy"` or `"chain"`.
    fn name(&self, py: Python<'_>) -> PyResult<String> {
        self.with_sampler(py, |sampler| Ok(sampler.name()))
    }

    fn __repr__(&self) -> String {
        match self.sampler.try_lock() {
            Ok(sampler) => format!("<LlamaSampler {}>", sampler.0.name()),
            Err(_) => "<LlamaSampler (busy)>".to_owned(),
        }
    }
}
