//! `SamplingParams`: how a request picks its tokens, checked once and built into a fresh
//! llama.cpp sampler chain per request (samplers have state: penalties, the random generator).

use std::collections::BTreeMap;

use llama_cpp_4::sampling::LlamaSampler;
use llama_cpp_4::token::LlamaToken;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::{Error, Result};
use crate::model::PyLlamaModel;
use crate::sampler::{finite, probability, window, PyLlamaSampler};

/// llama.cpp's seed that asks its random generator for a seed of its own [llama.cpp internal].
const RANDOM_SEED: u32 = u32::MAX;

/// How a request samples: `temperature` 0 is greedy (penalties and `logit_bias` still apply);
/// otherwise the candidates pass `top_k` (0: all), `typical_p`, `top_p` and `min_p` (1, 1 and
/// 0 switch them off), are scaled by the temperature and drawn with `seed` (None: random).
/// Penalties look at the last `penalty_last_n` tokens (1 and 0 switch them off).
/// `logit_bias` maps token ids to values added to their logits (`-inf` bans a token).
#[pyclass(frozen, module = "llamactx", name = "SamplingParams", get_all)]
#[derive(Debug, Clone)]
pub struct PySamplingParams {
    /// Scales the logits; 0 picks the most likely token (greedy).
    temperature: f32,
    /// Keeps the `top_k` most likely tokens (0 keeps all).
    top_k: i32,
    /// Keeps the most likely tokens whose probabilities add up to `top_p` (1: all).
    top_p: f32,
    /// Drops tokens less likely than `min_p` times the most likely one (0: none).
    min_p: f32,
    /// Locally typical sampling mass (1: off).
    typical_p: f32,
    /// Divides the logits of tokens seen in the window (1: off).
    repeat_penalty: f32,
    /// Subtracted per occurrence in the window (0: off).
    frequency_penalty: f32,
    /// Subtracted once for tokens present in the window (0: off).
    presence_penalty: f32,
    /// The window of last tokens the penalties look at (0: off).
    penalty_last_n: i32,
    /// Token id to a value added to its logit.
    logit_bias: BTreeMap<i32, f32>,
    /// The random generator's seed; None draws one.
    seed: Option<u32>,
}

impl PySamplingParams {
    /// Greedy, with nothing else: what `generate` does by default.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 0,
            logit_bias: BTreeMap::new(),
            seed: None,
        }
    }

    /// `ValueError` for a logit bias on a token the model does not have.
    pub fn check_vocabulary(&self, n_vocab: i32) -> Result<()> {
        match self.logit_bias.keys().find(|&&token| token < 0 || token >= n_vocab) {
            Some(token) => Err(Error::value(format!(
                "logit_bias names token {token}, outside the model's vocabulary [0, {n_vocab})"
            ))),
            None => Ok(()),
        }
    }

    /// Whether the chain has a penalties stage.
    fn penalised(&self) -> bool {
        // Exactly the neutral values switch penalties off, as llama.cpp's own check does.
        #[allow(clippy::float_cmp)]
        let penalised = self.repeat_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0;
        penalised && self.penalty_last_n > 0
    }

    /// Draws from every token at temperature 1 with `seed` (for the scheduler's tests).
    #[cfg(test)]
    pub fn seeded(seed: u32) -> Self {
        Self {
            temperature: 1.0,
            seed: Some(seed),
            ..Self::greedy()
        }
    }

    /// What `build`'s chain picks, without the chain, when it is `logit_bias` (if any) then
    /// `greedy`: a stateless choice.
    pub fn greedy_pick(&self) -> Option<GreedyPick> {
        (self.temperature <= 0.0 && !self.penalised()).then(|| GreedyPick {
            biases: self.logit_bias.iter().map(|(&token, &bias)| (token, bias)).collect(),
        })
    }

    /// A new chain for one request of a model with `n_vocab` tokens (checked by
    /// `check_vocabulary`).
    pub fn build(&self, n_vocab: i32) -> LlamaSampler {
        let mut stages = Vec::new();
        if self.penalised() {
            stages.push(LlamaSampler::penalties(
                n_vocab,
                self.penalty_last_n,
                self.repeat_penalty,
                self.frequency_penalty,
                self.presence_penalty,
            ));
        }
        if !self.logit_bias.is_empty() {
            let biases: Vec<(LlamaToken, f32)> = self
                .logit_bias
                .iter()
                .map(|(&token, &bias)| (LlamaToken::new(token), bias))
                .collect();
            stages.push(LlamaSampler::logit_bias(n_vocab, &biases));
        }
        if self.temperature <= 0.0 {
            stages.push(LlamaSampler::greedy());
        } else {
            if self.top_k > 0 {
                stages.push(LlamaSampler::top_k(self.top_k));
            }
            if self.typical_p < 1.0 {
                stages.push(LlamaSampler::typical(self.typical_p, 1));
            }
            if self.top_p < 1.0 {
                stages.push(LlamaSampler::top_p(self.top_p, 1));
            }
            if self.min_p > 0.0 {
                stages.push(LlamaSampler::min_p(self.min_p, 1));
            }
            stages.push(LlamaSampler::temp(self.temperature));
            stages.push(LlamaSampler::dist(self.seed.unwrap_or(RANDOM_SEED)));
        }
        LlamaSampler::chain(stages, true)
    }
}

/// `[logit_bias(biases), greedy()]` picked straight from a row of logits. llama.cpp's chain
/// first copies every token into a candidate array, which took 0.12 ms a token here (49,152
/// tokens), on the engine thread while the decode threads wait.
#[derive(Debug)]
pub struct GreedyPick {
    /// Token ids (ascending, checked against the vocabulary) and the values added to their logits.
    biases: Vec<(i32, f32)>,
}

impl GreedyPick {
    /// The token greedy picks: the first of the highest biased logits (as llama.cpp's greedy
    /// sampler keeps the first of equal ones). `None` when the biases leave no token.
    pub fn pick(&self, logits: &[f32]) -> Option<LlamaToken> {
        let mut biases = self.biases.iter().peekable();
        let mut best: Option<(i32, f32)> = None;
        for (token, &logit) in (0..).zip(logits) {
            let logit = match biases.next_if(|&&(biased, _)| biased == token) {
                Some(&(_, bias)) => logit + bias,
                None => logit,
            };
            if best.is_none_or(|(_, highest)| logit > highest) {
                best = Some((token, logit));
            }
        }
        best.filter(|&(_, logit)| logit != f32::NEG_INFINITY)
            .map(|(token, _)| LlamaToken::new(token))
    }
}

#[pymethods]
impl PySamplingParams {
    #[new]
    #[pyo3(signature = (
        *, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, typical_p=1.0, repeat_penalty=1.0,
        frequency_penalty=0.0, presence_penalty=0.0, penalty_last_n=64, logit_bias=None, seed=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        temperature: f32,
        top_k: i32,
        top_p: f32,
        min_p: f32,
        typical_p: f32,
        repeat_penalty: f32,
        frequency_penalty: f32,
        presence_penalty: f32,
        penalty_last_n: i32,
        logit_bias: Option<BTreeMap<i32, f32>>,
        seed: Option<u32>,
    ) -> PyResult<Self> {
        let temperature = crate::sampler::temperature("temperature", temperature)?;
        if temperature < 0.0 {
            return Err(Error::value(format!("temperature must be >= 0, got {temperature}")).into());
        }
        if top_k < 0 {
            return Err(Error::value(format!("top_k must be >= 0 (0 keeps every token), got {top_k}")).into());
        }
        let logit_bias = logit_bias.unwrap_or_default();
        if let Some(token) = logit_bias
            .iter()
            .find_map(|(token, bias)| bias.is_nan().then_some(token))
        {
            return Err(Error::value(format!("the bias of token {token} is NaN")).into());
        }
        if seed == Some(RANDOM_SEED) {
            return Err(Error::value(format!(
                "seed {RANDOM_SEED} means 'random' to llama.cpp: pass None for that"
            ))
            .into());
        }
        Ok(Self {
            temperature,
            top_k,
            top_p: probability("top_p", top_p)?,
            min_p: probability("min_p", min_p)?,
            typical_p: probability("typical_p", typical_p)?,
            repeat_penalty: finite("repeat_penalty", repeat_penalty)?,
            frequency_penalty: finite("frequency_penalty", frequency_penalty)?,
            presence_penalty: finite("presence_penalty", presence_penalty)?,
            penalty_last_n: window("penalty_last_n", penalty_last_n, 0)?,
            logit_bias,
            seed,
        })
    }

    /// These parameters as a `LlamaSampler` chain for `model`, for `generate` and friends (each
    /// call builds a fresh chain: samplers keep state). `ValueError` for a logit bias on a token
    /// the model does not have.
    fn sampler(&self, model: &Bound<'_, PyLlamaModel>) -> PyResult<PyLlamaSampler> {
        let model = model.get().vocabulary()?;
        let n_vocab = model.n_vocab();
        self.check_vocabulary(n_vocab)?;
        Ok(PyLlamaSampler::for_model(self.build(n_vocab), model))
    }

    /// Pickling (Ray ships parameters to its workers this way): the keywords that rebuild it.
    fn __getnewargs_ex__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        let keywords = PyDict::new(py);
        keywords.set_item("temperature", self.temperature)?;
        keywords.set_item("top_k", self.top_k)?;
        keywords.set_item("top_p", self.top_p)?;
        keywords.set_item("min_p", self.min_p)?;
        keywords.set_item("typical_p", self.typical_p)?;
        keywords.set_item("repeat_penalty", self.repeat_penalty)?;
        keywords.set_item("frequency_penalty", self.frequency_penalty)?;
        keywords.set_item("presence_penalty", self.presence_penalty)?;
        keywords.set_item("penalty_last_n", self.penalty_last_n)?;
        keywords.set_item("logit_bias", self.logit_bias.clone())?;
        keywords.set_item("seed", self.seed)?;
        Ok((PyTuple::empty(py), keywords))
    }

    fn __repr__(&self) -> String {
        format!(
            "SamplingParams(temperature={}, top_k={}, top_p={}, min_p={}, typical_p={}, repeat_penalty={}, \
             frequency_penalty={}, presence_penalty={}, penalty_last_n={}, logit_bias={:?}, seed={})",
            self.temperature,
            self.top_k,
            self.top_p,
            self.min_p,
            self.typical_p,
            self.repeat_penalty,
            self.frequency_penalty,
            self.presence_penalty,
            self.penalty_last_n,
            self.logit_bias,
            self.seed.map_or_else(|| "None".to_owned(), |seed| seed.to_string()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::GreedyPick;

    fn pick(biases: &[(i32, f32)], logits: &[f32]) -> Option<i32> {
        GreedyPick {
            biases: biases.to_vec(),
        }
        .pick(logits)
        .map(|token| token.0)
    }

    #[test]
    fn the_first_of_the_highest_logits_is_picked() {
        assert_eq!(pick(&[], &[0.5, 2.0, -1.0, 2.0]), Some(1));
    }

    #[test]
    fn biases_apply_before_the_pick() {
        let logits = [0.5, 2.0, -1.0, 2.0];
        assert_eq!(pick(&[(1, f32::NEG_INFINITY)], &logits), Some(3));
        assert_eq!(pick(&[(0, 1.5), (1, -0.5)], &logits), Some(0));
        assert_eq!(pick(&[(2, 3.5)], &logits), Some(2));
    }

    #[test]
    fn nothing_is_picked_when_every_token_is_banned() {
        let banned = [(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)];
        assert_eq!(pick(&banned, &[1.0, 2.0]), None);
    }
}
