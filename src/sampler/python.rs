//! `LlamaSampler`: llama.cpp's token samplers, built with the crate's constructors.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::sampling::LlamaSampler;
use llama_cpp_4::token::LlamaToken;
use pyo3::prelude::*;

use super::backend_stages::{self, Stage};
use super::{
    finite, guidance, lazy_grammar, probability, refuse_unfinished_end, select, temperature, try_accept, window,
    SendSampler,
};
use crate::context::PyLlamaContext;
use crate::errors::python::to_py;
use crate::errors::{Error, Result};
use crate::gil::detached;
use crate::model::python::PyLlamaModel;
use crate::token_data::PyLlamaTokenDataArray;
use crate::tokens::python::extract_token_ids;
use crate::tokens::{check_vocab, to_llama_tokens};

/// A llama.cpp sampler (or chain of samplers) that picks the next token from logits.
#[pyclass(frozen, module = "llamactx", name = "LlamaSampler")]
pub struct PyLlamaSampler {
    sampler: Mutex<SendSampler>,
    /// Set when the sampler refused a token: llama.cpp's grammar then keeps an empty state that
    /// aborts the process on its next use. Only `reset()` repairs it.
    broken: AtomicBool,
    /// Models whose vocabulary the sampler points into (grammar, DRY, infill, and chains
    /// holding them). Declared after `sampler`, so it is dropped first.
    models: Vec<Arc<LlamaModel>>,
    /// Its stages, in order, for `check_backend`.
    stages: Vec<Stage>,
}

impl PyLlamaSampler {
    /// A copy for `llama_set_sampler`, which only accepts chains (it reads any sampler it is
    /// given as one).
    pub fn backend_copy(&self, py: Python<'_>) -> PyResult<SendSampler> {
        self.with_sampler(py, |sampler| {
            self.check_usable()?;
            let copy = sampler.clone_sampler();
            Ok(SendSampler(if copy.name() == "chain" {
                copy
            } else {
                LlamaSampler::chain_simple([copy])
            }))
        })
    }

    /// A copy of this sampler's state for a request of the engine on `model` (refused for a
    /// sampler of another model or one a refused token left unusable).
    pub(crate) fn copy_for(&self, py: Python<'_>, model: &Arc<LlamaModel>) -> PyResult<SendSampler> {
        self.check_model(model).map_err(to_py)?;
        self.with_sampler(py, |sampler| {
            self.check_usable()?;
            Ok(SendSampler(sampler.clone_sampler()))
        })
    }

    /// Takes the state of `copy` (a `copy_for` of this sampler that went on choosing tokens);
    /// `refused`: the copy refused a token it chose, which leaves this one unusable until
    /// `reset()`.
    pub(crate) fn take_state(&self, copy: LlamaSampler, refused: bool) {
        if let Ok(mut sampler) = self.lock() {
            *sampler = SendSampler(copy);
            if refused {
                self.broken.store(true, Ordering::Release);
            }
        }
    }

    /// A CPU-only sampler (or chain) that points into `model`'s vocabulary.
    pub(crate) fn for_model(sampler: LlamaSampler, model: Arc<LlamaModel>) -> Self {
        ModelSampler::new(sampler, model).into_sampler()
    }

    fn new(sampler: LlamaSampler, stage: Stage) -> Self {
        Self::with_models(sampler, Vec::new(), vec![stage])
    }

    fn with_models(sampler: LlamaSampler, models: Vec<Arc<LlamaModel>>, stages: Vec<Stage>) -> Self {
        Self {
            sampler: Mutex::new(SendSampler(sampler)),
            broken: AtomicBool::new(false),
            models,
            stages,
        }
    }

    /// `ValueError` for a sampler whose backend stages do not fit a context of `n_vocab`
    /// tokens (see `backend_stages::check_backend`).
    pub fn check_backend(&self, n_vocab: i32) -> Result<()> {
        backend_stages::check_backend(&self.stages, n_vocab)
    }

    /// Refuses a sampler that a refused token left unusable.
    fn check_usable(&self) -> Result<()> {
        if self.broken.load(Ordering::Acquire) {
            return Err(Error::value(
                "this sampler refused a token, which leaves its grammar unusable: call reset()",
            ));
        }
        Ok(())
    }

    /// Accepts `token` into `sampler` (this sampler, locked), unless a grammar cannot take it.
    fn accept_locked(&self, sampler: &mut LlamaSampler, token: LlamaToken) -> Result<()> {
        let end_of_generation = self.models.iter().any(|model| model.is_eog_token(token));
        refuse_unfinished_end(end_of_generation, sampler, token)?;
        try_accept(sampler, token).inspect_err(|_| self.broken.store(true, Ordering::Release))
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

    /// A sampler bound to a vocabulary may only see tokens of that vocabulary: llama.cpp
    /// indexes it by token id without checking.
    fn check_model(&self, model: &Arc<LlamaModel>) -> Result<()> {
        if self.models.iter().all(|own| Arc::ptr_eq(own, model)) {
            Ok(())
        } else {
            Err(Error::value("this sampler was built for another model"))
        }
    }

    fn check_token(&self, token: i32) -> Result<LlamaToken> {
        let built_for = self.stages.iter().filter_map(|stage| stage.built_for());
        let n_vocab = self.models.iter().map(|model| model.n_vocab()).chain(built_for).min();
        if token < 0 || n_vocab.is_some_and(|n_vocab| token >= n_vocab) {
            return Err(Error::value(format!(
                "token id {token} is outside the sampler's vocabulary"
            )));
        }
        Ok(LlamaToken::new(token))
    }
}

/// The model a vocabulary-bound sampler reads token texts of.
fn model_of(model: &Bound<'_, PyLlamaModel>) -> Result<Arc<LlamaModel>> {
    model.get().vocabulary()
}

/// The buffers llama.cpp's infill sampler reads token pieces into [llama.cpp internal].
const INFILL_PIECE_BYTES: usize = 512;

/// llama.cpp's infill sampler answers "only end-of-generation tokens are left" with the EOT (or
/// EOS) token and asserts there is one; and it resizes its piece buffers by the negative length
/// `token_to_piece` returns for a longer piece (a C++ throw across FFI). Both are properties of
/// the vocabulary, so they are checked once, when the sampler is made.
fn check_infill_vocabulary(model: &LlamaModel) -> Result<()> {
    if model.token_eot() == LlamaToken::new(-1) && model.token_eos() == LlamaToken::new(-1) {
        return Err(Error::value(
            "infill needs a vocabulary with an end-of-text (EOT) or end-of-sequence (EOS) token",
        ));
    }
    for id in 0..model.n_vocab() {
        let length = crate::model::piece(model, id, false)?.len();
        if length > INFILL_PIECE_BYTES {
            return Err(Error::value(format!(
                "infill cannot handle token {id}: its text is {length} bytes, over llama.cpp's \
                 {INFILL_PIECE_BYTES}-byte buffer"
            )));
        }
    }
    Ok(())
}

/// A freshly built sampler with the model it points into, able to leave a GIL-free closure.
struct ModelSampler(SendSampler, Arc<LlamaModel>);

impl ModelSampler {
    fn new(sampler: LlamaSampler, model: Arc<LlamaModel>) -> Self {
        Self(SendSampler(sampler), model)
    }

    fn into_sampler(self) -> PyLlamaSampler {
        PyLlamaSampler::with_models(self.0 .0, vec![self.1], vec![Stage::Cpu])
    }
}

#[pymethods]
impl PyLlamaSampler {
    /// Always picks the most likely token.
    #[staticmethod]
    fn greedy() -> Self {
        Self::new(LlamaSampler::greedy(), Stage::Plain)
    }

    /// Picks a token at random by its probability, from a generator seeded with `seed`.
    #[staticmethod]
    fn dist(seed: u32) -> Self {
        Self::new(LlamaSampler::dist(seed), Stage::Dist)
    }

    /// Divides the logits by temperature `t` (`t` below 1e-6 keeps only the most likely token).
    #[staticmethod]
    fn temp(t: f32) -> PyResult<Self> {
        let t = temperature("t", t).map_err(to_py)?;
        Ok(Self::new(LlamaSampler::temp(t), Stage::temperature(t)))
    }

    /// Keeps the `k` most likely tokens (`k <= 0` keeps all).
    #[staticmethod]
    fn top_k(k: i32) -> Self {
        Self::new(LlamaSampler::top_k(k), Stage::TopK(k))
    }

    /// Keeps the most likely tokens whose probabilities add up to `p` (at least `min_keep`).
    #[staticmethod]
    #[pyo3(signature = (p, min_keep=1))]
    fn top_p(p: f32, min_keep: usize) -> PyResult<Self> {
        Ok(Self::new(
            LlamaSampler::top_p(probability("p", p).map_err(to_py)?, min_keep),
            Stage::TopP,
        ))
    }

    /// Keeps tokens at least `p` times as likely as the most likely one (at least `min_keep`).
    #[staticmethod]
    #[pyo3(signature = (p, min_keep=1))]
    fn min_p(p: f32, min_keep: usize) -> PyResult<Self> {
        Ok(Self::new(
            LlamaSampler::min_p(probability("p", p).map_err(to_py)?, min_keep),
            Stage::Plain,
        ))
    }

    /// Temperature with dynamic range: `t` adjusted by entropy within `delta`, `exponent` (`t`
    /// below 1e-6 keeps only the most likely token).
    #[staticmethod]
    fn temp_ext(t: f32, delta: f32, exponent: f32) -> PyResult<Self> {
        let t = temperature("t", t).map_err(to_py)?;
        Ok(Self::new(
            LlamaSampler::temp_ext(
                t,
                finite("delta", delta).map_err(to_py)?,
                finite("exponent", exponent).map_err(to_py)?,
            ),
            Stage::temperature(t),
        ))
    }

    /// Locally typical sampling with mass `p` (at least `min_keep` tokens).
    #[staticmethod]
    #[pyo3(signature = (p, min_keep=1))]
    fn typical(p: f32, min_keep: usize) -> PyResult<Self> {
        Ok(Self::new(
            LlamaSampler::typical(probability("p", p).map_err(to_py)?, min_keep),
            Stage::Cpu,
        ))
    }

    /// XTC: with probability `p`, removes the top tokens above threshold `t`.
    #[staticmethod]
    #[pyo3(signature = (p, t, min_keep=1, seed=0))]
    fn xtc(p: f32, t: f32, min_keep: usize, seed: u32) -> PyResult<Self> {
        Ok(Self::new(
            LlamaSampler::xtc(
                probability("p", p).map_err(to_py)?,
                finite("t", t).map_err(to_py)?,
                min_keep,
                seed,
            ),
            Stage::Cpu,
        ))
    }

    /// Keeps tokens within `n` standard deviations of the top logit.
    #[staticmethod]
    fn top_n_sigma(n: f32) -> PyResult<Self> {
        Ok(Self::new(
            LlamaSampler::top_n_sigma(finite("n", n).map_err(to_py)?),
            Stage::Cpu,
        ))
    }

    /// Mirostat 1.0 with target surprise `tau`, learning rate `eta` and `m` tokens for its
    /// estimate.
    #[staticmethod]
    fn mirostat(n_vocab: i32, seed: u32, tau: f32, eta: f32, m: i32) -> PyResult<Self> {
        if n_vocab < 1 || m < 1 {
            return Err(to_py(Error::value("n_vocab and m must be at least 1")));
        }
        Ok(Self::new(
            LlamaSampler::mirostat(
                n_vocab,
                seed,
                finite("tau", tau).map_err(to_py)?,
                finite("eta", eta).map_err(to_py)?,
                m,
            ),
            Stage::Cpu,
        ))
    }

    /// Mirostat 2.0 with target surprise `tau` and learning rate `eta`.
    #[staticmethod]
    fn mirostat_v2(seed: u32, tau: f32, eta: f32) -> PyResult<Self> {
        Ok(Self::new(
            LlamaSampler::mirostat_v2(
                seed,
                finite("tau", tau).map_err(to_py)?,
                finite("eta", eta).map_err(to_py)?,
            ),
            Stage::Cpu,
        ))
    }

    /// Adaptive-p: steers toward tokens of probability `target`, with history `decay`.
    #[staticmethod]
    fn adaptive_p(target: f32, decay: f32, seed: u32) -> PyResult<Self> {
        Ok(Self::new(
            LlamaSampler::adaptive_p(
                probability("target", target).map_err(to_py)?,
                finite("decay", decay).map_err(to_py)?,
                seed,
            ),
            Stage::Cpu,
        ))
    }

    /// Repetition penalties over the last `penalty_last_n` tokens (0 disables them; at most
    /// 2**20). `ValueError` for -1, which means "the context size" only on llama.cpp's command
    /// line: the sampler itself would penalise nothing.
    #[staticmethod]
    fn penalties(
        n_vocab: i32,
        penalty_last_n: i32,
        penalty_repeat: f32,
        penalty_freq: f32,
        penalty_present: f32,
    ) -> PyResult<Self> {
        if penalty_last_n == -1 {
            return Err(to_py(Error::value(
                "penalty_last_n=-1 means the context size only on llama.cpp's command line; this sampler would \
                 then penalise nothing: pass the window in tokens (e.g. the context's n_ctx())",
            )));
        }
        Ok(Self::new(
            LlamaSampler::penalties(
                n_vocab,
                window("penalty_last_n", penalty_last_n, 0).map_err(to_py)?,
                finite("penalty_repeat", penalty_repeat).map_err(to_py)?,
                finite("penalty_freq", penalty_freq).map_err(to_py)?,
                finite("penalty_present", penalty_present).map_err(to_py)?,
            ),
            Stage::Penalties { n_vocab },
        ))
    }

    /// Adds `bias` to the logits of given tokens: `biases` is a sequence of `(token, bias)`.
    #[staticmethod]
    fn logit_bias(n_vocab: i32, biases: Vec<(i32, f32)>) -> PyResult<Self> {
        if let Some((token, _)) = biases.iter().find(|(token, _)| *token < 0 || *token >= n_vocab) {
            return Err(to_py(Error::value(format!(
                "token id {token} is outside [0, {n_vocab})"
            ))));
        }
        // Infinite biases are how tokens are banned or forced; NaN poisons every comparison.
        if let Some((token, _)) = biases.iter().find(|(_, bias)| bias.is_nan()) {
            return Err(to_py(Error::value(format!("the bias of token {token} is NaN"))));
        }
        let biases: Vec<(LlamaToken, f32)> = biases
            .into_iter()
            .map(|(token, bias)| (LlamaToken::new(token), bias))
            .collect();
        let max_token = biases.iter().map(|(token, _)| token.0).max();
        Ok(Self::new(
            LlamaSampler::logit_bias(n_vocab, &biases),
            Stage::LogitBias { n_vocab, max_token },
        ))
    }

    /// Constrains tokens to the GBNF `grammar`, starting at rule `root`, with llama.cpp's own
    /// grammar engine (the crate's sampler). Its work per token is unbounded for ambiguous
    /// grammars (one stack per partial parse), so a grammar from outside the program belongs
    /// in `llguidance(model, "gbnf", grammar)`, which every `grammar=` argument uses. Keeps
    /// `model` alive. `SamplerInitError` for a grammar llama.cpp cannot parse.
    #[staticmethod]
    #[pyo3(signature = (model, grammar, root="root".to_owned()), text_signature = "(model, grammar, root='root')")]
    fn grammar(py: Python<'_>, model: &Bound<'_, PyLlamaModel>, grammar: String, root: String) -> PyResult<Self> {
        let model = model_of(model).map_err(to_py)?;
        detached(py, move || {
            let sampler = LlamaSampler::try_grammar(&model, &grammar, &root)?;
            Ok(ModelSampler::new(sampler, model))
        })
        .map(ModelSampler::into_sampler)
    }

    /// Constrains tokens to `data` with llguidance, compiled against `model`'s vocabulary:
    /// `kind` "json_schema" (a JSON Schema, as JSON text), "lark" (llguidance's Lark dialect),
    /// "regex" or "gbnf" (llama.cpp's GBNF from rule `root`, translated to Lark: the same language,
    /// with llguidance's bounded work per step). Output may only end (an end-of-generation token)
    /// where the constraint is complete, and must end once it is. Keeps `model` alive.
    /// `SchemaError` when llguidance cannot compile the constraint or it admits no output;
    /// `SamplerInitError` for GBNF that llama.cpp would not parse either.
    #[staticmethod]
    fn llguidance(py: Python<'_>, model: &Bound<'_, PyLlamaModel>, kind: String, data: String) -> PyResult<Self> {
        let model = model_of(model).map_err(to_py)?;
        detached(py, move || {
            let sampler = guidance::new(&model, &kind, &data)?;
            Ok(ModelSampler::new(sampler, model))
        })
        .map(ModelSampler::into_sampler)
    }

    /// A grammar that applies only after one of `trigger_patterns` (regexes) or
    /// `trigger_tokens` appears; the grammar then starts where the pattern's first matching
    /// group starts (or the whole match, or the trigger token), or, when it does not take that
    /// text, after the match (a call's grammar without the marker that triggers it). Patterns
    /// use the `regex`
    /// crate's syntax, matched byte-wise with ASCII classes like llama.cpp's `std::regex`, in
    /// linear time; a pattern with look-around (Functionary's `>>>(?!all)`) is matched by
    /// `fancy-regex` over the text's UTF-8, at most 100,000 backtracking steps a search (past
    /// them the request fails); back-references are refused (`ValueError`), and a trigger must
    /// lie within the last 16 KiB of accepted text. The GBNF grammar is compiled by
    /// llguidance (as `llguidance(model, "gbnf", ...)`), so its work per token is bounded.
    /// `SamplerInitError` for a grammar llama.cpp would not parse either; once triggered, text
    /// the grammar refuses is `SchemaError`.
    #[staticmethod]
    fn grammar_lazy_patterns(
        py: Python<'_>,
        model: &Bound<'_, PyLlamaModel>,
        grammar: String,
        root: String,
        trigger_patterns: Vec<String>,
        trigger_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let model = model_of(model).map_err(to_py)?;
        let tokens = extract_token_ids(trigger_tokens)?;
        detached(py, move || {
            check_vocab(&tokens, model.n_vocab())?;
            let sampler = lazy_grammar::new(
                Arc::clone(&model),
                &grammar,
                &root,
                &trigger_patterns,
                to_llama_tokens(&tokens),
            )?;
            Ok(ModelSampler::new(sampler, model))
        })
        .map(ModelSampler::into_sampler)
    }

    /// DRY ("don't repeat yourself") penalties; `seq_breakers` end a repeated sequence.
    #[staticmethod]
    #[pyo3(signature = (model, multiplier, base, allowed_length, penalty_last_n, seq_breakers=Vec::new()))]
    fn dry(
        py: Python<'_>,
        model: &Bound<'_, PyLlamaModel>,
        multiplier: f32,
        base: f32,
        allowed_length: i32,
        penalty_last_n: i32,
        seq_breakers: Vec<String>,
    ) -> PyResult<Self> {
        // DRY tokenizes its sequence breakers.
        let model = model.get().tokenizer().map_err(to_py)?;
        let (multiplier, base) = (
            finite("multiplier", multiplier).map_err(to_py)?,
            finite("base", base).map_err(to_py)?,
        );
        let penalty_last_n = window("penalty_last_n", penalty_last_n, -1).map_err(to_py)?;
        detached(py, move || {
            let sampler = LlamaSampler::greedy().try_dry(
                &model,
                multiplier,
                base,
                allowed_length,
                penalty_last_n,
                &seq_breakers,
            )?;
            Ok(ModelSampler::new(sampler, model))
        })
        .map(ModelSampler::into_sampler)
    }

    /// Fill-in-the-middle sampling for infill models.
    #[staticmethod]
    fn infill(model: &Bound<'_, PyLlamaModel>) -> PyResult<Self> {
        let model = model_of(model).map_err(to_py)?;
        check_infill_vocabulary(&model).map_err(to_py)?;
        Ok(ModelSampler::new(LlamaSampler::infill(&model), model).into_sampler())
    }

    /// Applies `samplers` in order; the last one must select a token (`greedy` or `dist`).
    /// The chain holds copies: the given samplers stay usable on their own.
    #[staticmethod]
    #[pyo3(signature = (samplers, no_perf=false))]
    fn chain(py: Python<'_>, samplers: Vec<Py<PyLlamaSampler>>, no_perf: bool) -> PyResult<Self> {
        let mut copies = Vec::with_capacity(samplers.len());
        let mut models = Vec::new();
        let mut stages = Vec::new();
        for sampler in &samplers {
            let sampler = sampler.get();
            sampler.check_usable().map_err(to_py)?;
            copies.push(sampler.with_sampler(py, |sampler| Ok(SendSampler(sampler.clone_sampler())))?);
            models.extend(sampler.models.iter().cloned());
            stages.extend(sampler.stages.iter().copied());
        }
        let chain = LlamaSampler::chain(copies.into_iter().map(|copy| copy.0), no_perf);
        Ok(Self::with_models(chain, models, stages))
    }

    /// Samples a token from output row `idx` of `ctx` (negative counts from the last output)
    /// and returns its id; like llama.cpp's `llama_sampler_sample`, this also accepts the
    /// token (do not `accept` it again). `IndexError` if that row has no logits (or the context
    /// computes none); `ValueError` if the sampler selects no token (it must end with greedy,
    /// dist, mirostat, mirostat_v2 or adaptive_p) or a refused token left it unusable (call
    /// `reset()`); `ShimError` when no candidate is left that the sampler allows (e.g. a grammar
    /// after top_k), in which case nothing is accepted.
    #[pyo3(signature = (ctx, idx=-1), text_signature = "(self, ctx, idx=-1)")]
    fn sample(&self, py: Python<'_>, ctx: &Bound<'_, PyLlamaContext>, idx: i32) -> PyResult<i32> {
        ctx.get().run(py, |native| {
            let row = native.full_logits_row(idx)?;
            self.check_model(native.model())?;
            let mut sampler = self.lock()?;
            self.check_usable()?;
            let chosen = select(native, &mut sampler.0, row)?;
            self.accept_locked(&mut sampler.0, chosen.id())?;
            Ok(chosen.id().0)
        })
    }

    /// Applies the sampler to `candidates` in place (filters, sorts, sets probabilities or
    /// selects a token, depending on the sampler).
    fn apply(&self, py: Python<'_>, candidates: &Bound<'_, PyLlamaTokenDataArray>) -> PyResult<()> {
        let candidates = candidates.get();
        self.with_sampler(py, |sampler| {
            self.check_usable()?;
            let mut guard = candidates.lock()?;
            if let Some(token) = guard.data.iter().map(|data| data.id().0).max() {
                self.check_token(token)?;
            }
            guard.apply_sampler(sampler);
            Ok(())
        })
    }

    /// Tells the sampler that `token` was chosen (updates penalties, grammar state, ...).
    fn accept(&self, py: Python<'_>, token: i32) -> PyResult<()> {
        let token = self.check_token(token).map_err(to_py)?;
        self.with_sampler(py, |sampler| {
            self.check_usable()?;
            self.accept_locked(sampler, token)
        })
    }

    /// Forgets what was accepted so far.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        self.with_sampler(py, |sampler| {
            sampler.reset();
            self.broken.store(false, Ordering::Release);
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

/// Python's check of a JSON Schema (`OutputCheck`) refuses here, before its own far costlier
/// work, a constraint too large to compile (`guidance::check_size`: `SchemaError` kind
/// `TooLarge`).
#[pyfunction]
#[pyo3(name = "_check_constraint_size")]
pub fn check_constraint_size(kind: &str, data: &str) -> PyResult<()> {
    guidance::check_size(kind, data).map_err(to_py)
}
