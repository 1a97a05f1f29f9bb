//! The engine's Python side: `_EngineCore` (wrapped by `llamactx.Engine`), its slots and
//! `EngineStats`; the step loop on a caller's context (`context_loop.rs`); what `speculative=`
//! holds (`speculative_options.rs`).

pub mod context_loop;
pub mod speculative_options;

use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use llamactx_engine::{engine_stats_doc, engine_stats_fields};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::slots::SlotChore;
use super::{Constraint, Engine, EngineSettings, EngineStats, Submission};
pub use crate::engine::request::python::{PyCompletion, PyRequestCore, PyWaker};
use crate::errors::python::to_py;
use crate::errors::{Error, Result};
use crate::gil::detached;
use crate::lora::python::PyLlamaLoraAdapter;
use crate::media::python::{PyMtmdContext, PyMtmdInputChunks};
use crate::model::python::PyLlamaModel;
use crate::prompt_checks;
use crate::sampler::params::python::PySamplingParams;
use crate::sampler::params::SamplingParams;
use crate::sampler::python::PyLlamaSampler;
pub use context_loop::PyContextLoop;
use speculative_options::SpeculativeOptions;

/// The native engine behind `llamactx.Engine`.
#[pyclass(frozen, weakref, module = "llamactx", name = "_EngineCore")]
pub struct PyEngineCore(pub Engine);

#[pymethods]
impl PyEngineCore {
    #[new]
    #[pyo3(signature = (model, max_waiting, prefix_cache, *, speculative=None, mtmd=None, lora=None, **options))]
    #[allow(clippy::too_many_arguments)] // Python's keywords, each its own
    fn new(
        py: Python<'_>,
        model: &Bound<'_, PyLlamaModel>,
        max_waiting: usize,
        prefix_cache: bool,
        speculative: Option<&Bound<'_, PyAny>>,
        mtmd: Option<Py<PyMtmdContext>>,
        lora: Option<(Py<PyLlamaLoraAdapter>, f32)>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let options = crate::context::params::from_kwargs(options)?;
        let speculative = speculative.map(SpeculativeOptions::read).transpose()?;
        let native_model = model.get().tokenizer().map_err(to_py)?;
        let drafting = speculative
            .map(|speculative| {
                let gated = speculative.gated;
                speculative.choice(&native_model).map(|choice| (choice, gated))
            })
            .transpose()
            .map_err(to_py)?;
        let settings = EngineSettings {
            max_waiting,
            prefix_cache,
            drafting,
            projector: mtmd.map(|projector| Arc::clone(&projector.get().shared)),
            lora: lora.map(|(adapter, scale)| (Arc::clone(&adapter.get().0), scale)),
        };
        let learned_positions = model.get().learned_positions();
        detached(py, || {
            Engine::start(native_model, learned_positions, &options, settings)
        })
        .map(Self)
    }

    /// Queues a request for `tokens`, with each of `media` (`(at, chunks)`: an image's chunks
    /// from the engine's projector, to go before text token `at`) spliced in, generated with the
    /// engine's LoRA adapter at `lora_scale` (None: the engine's scale). `ValueError` for a
    /// prompt that can never run or a scale without an adapter, `EngineBusy` when `max_waiting`
    /// requests already wait.
    #[pyo3(signature = (tokens, max_tokens, stop, sampling, logprobs, constraint, media=Vec::new(), lora_scale=None))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        py: Python<'_>,
        tokens: Vec<i32>,
        max_tokens: i64,
        stop: Vec<String>,
        sampling: Option<&Bound<'_, PySamplingParams>>,
        logprobs: usize,
        constraint: Option<&Bound<'_, PyAny>>,
        media: Vec<(usize, Bound<'_, PyMtmdInputChunks>)>,
        lora_scale: Option<f32>,
    ) -> PyResult<PyRequestCore> {
        let max_tokens = prompt_checks::max_tokens(max_tokens).map_err(to_py)?;
        let constraint = match constraint {
            Some(prepared) if prepared.is_instance_of::<PyLlamaSampler>() => Some(Constraint::Sampler(
                prepared.cast::<PyLlamaSampler>()?.get().copy_for(py, self.0.model())?,
            )),
            Some(spec) => {
                let (kind, text): (String, String) = spec.extract()?;
                Some(Constraint::Grammar { kind, text })
            }
            None => None,
        };
        let submission = Submission {
            tokens,
            media: media.iter().map(|(at, chunks)| chunks.get().input_at(*at)).collect(),
            max_tokens,
            stop,
            sampling: sampling.map_or_else(SamplingParams::greedy, |sampling| sampling.get().0.clone()),
            constraint,
            logprobs,
            lora_scale,
        };
        let shared = detached(py, || self.0.submit(submission))?;
        Ok(PyRequestCore { shared })
    }

    /// The engine's counts now (`EngineStats`).
    fn stats(&self) -> PyEngineStats {
        PyEngineStats(self.0.stats())
    }

    /// Stops the engine: requests still waiting or running end as "cancelled"; returns once
    /// the engine thread has ended (after the step it is computing).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        detached(py, || self.0.stop())
    }

    /// KV cells of one sequence (`n_ctx / n_seq_max`): a prompt must be shorter.
    #[getter]
    fn n_ctx_seq(&self) -> usize {
        self.0.n_ctx_seq()
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.0.closed()
    }

    /// The scale of the engine's LoRA adapter for requests that name none (None without an
    /// adapter).
    #[getter]
    fn lora_scale(&self) -> PyResult<Option<f32>> {
        self.0.lora_scale().map_err(to_py)
    }

    /// Sets the scale of the engine's LoRA adapter for the requests submitted from now on that
    /// name none (llama-server's `POST /lora-adapters`). `ValueError` without an adapter, or for
    /// a scale that is not finite.
    fn set_lora_scale(&self, scale: f32) -> PyResult<()> {
        self.0.set_lora_scale(scale).map_err(to_py)
    }
}

impl PyEngineCore {
    /// Does the chore `make` builds on the engine thread and waits for its answer, without the
    /// GIL and looking for Ctrl-C between waits.
    fn chore<T: Send>(&self, py: Python<'_>, make: impl FnOnce(Sender<Result<T>>) -> SlotChore) -> PyResult<T> {
        let mut answer = self.0.send_chore(make).map_err(to_py)?;
        loop {
            // The receiver goes to the detached closure and back (it may be sent, not shared).
            let (got, back) = detached(py, move || {
                Ok((answer.recv_timeout(Duration::from_millis(100)), answer))
            })?;
            answer = back;
            match got {
                Ok(answer) => return answer.map_err(to_py),
                // An engine thread that ended without answering (it answers every chore it
                // leaves when it stops) ended by a fault the engine's own requests report.
                Err(RecvTimeoutError::Timeout) if !self.0.thread_ended() => py.check_signals()?,
                Err(_) => return Err(to_py(Error::closed("Engine"))),
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
        let seq = seq.map(|seq| self.0.slot(seq)).transpose().map_err(to_py)?;
        let files = self.chore(py, |reply| SlotChore::Save { seq, reply })?;
        Ok(files.iter().map(|file| PyBytes::new(py, file)).collect())
    }

    /// Restores a sequence state file into slot `seq` (once no request holds it), or into the
    /// free slot whose cache is worth least (`seq=None`), for the prefix cache to reuse; returns
    /// the slot and the number of tokens it holds. `StateError` for a file this context refuses
    /// (the slot is then empty), `ValueError` on an engine without a prefix cache.
    #[pyo3(signature = (file, seq=None))]
    fn restore_slot(&self, py: Python<'_>, file: &[u8], seq: Option<i64>) -> PyResult<(i32, usize)> {
        let seq = seq.map(|seq| self.0.slot(seq)).transpose().map_err(to_py)?;
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
        let seq = self.0.slot(seq).map_err(to_py)?;
        self.chore(py, |reply| SlotChore::Erase { seq, reply })
    }
}

#[doc = engine_stats_doc!()]
#[pyclass(frozen, module = "llamactx", name = "EngineStats")]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PyEngineStats(pub EngineStats);

macro_rules! engine_stats_getters {
    ($($(#[doc = $doc:literal])* $name:ident: $kept:ty,)*) => {
        #[pymethods]
        impl PyEngineStats {
            $(
                $(#[doc = $doc])*
                #[getter]
                fn $name(&self) -> $kept {
                    self.0.$name
                }
            )*

            fn __repr__(&self) -> String {
                let fields = [$( format!("{}={}", stringify!($name), self.0.$name) ),*];
                format!("EngineStats({})", fields.join(", "))
            }
        }
    };
}
engine_stats_fields!(engine_stats_getters);
