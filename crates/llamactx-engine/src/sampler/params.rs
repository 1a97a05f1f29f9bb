//! `SamplingParams`: how a request picks its tokens, checked once and built into a fresh
//! llama.cpp sampler chain per request (samplers have state: penalties, the random generator).

use std::collections::BTreeMap;

use llama_cpp_4::sampling::LlamaSampler;
use llama_cpp_4::token::LlamaToken;

use crate::errors::{Error, Result};

/// llama.cpp's seed that asks its random generator for a seed of its own [llama.cpp internal].
const RANDOM_SEED: u32 = u32::MAX;

/// Declares `SamplingParams` once: each field with the type it is kept as, its default (what
/// Python sees in the constructor's signature, where the server, the CLI and Ray read it), the
/// argument type Python passes, the check that turns the argument into the kept value, and the
/// value that switches the field off (`greedy`). The struct and `greedy` (below), and the Python
/// class's constructor, getters, pickling and `repr` (`python.rs`) are generated from this one
/// list, so a new parameter is one entry here plus its stage in `build`.
#[macro_export]
macro_rules! sampling_param_list {
    ($declare:ident) => {
        $declare! {
            /// Scales the logits; 0 picks the most likely token (greedy).
            temperature: f32 = 0.8, from (f32) by temperature, off 0.0;
            /// Keeps the `top_k` most likely tokens (0 keeps all).
            top_k: i32 = 40, from (i32) by top_k, off 0;
            /// Keeps the most likely tokens whose probabilities add up to `top_p` (1: all).
            top_p: f32 = 0.95, from (f32) by probability, off 1.0;
            /// Drops tokens less likely than `min_p` times the most likely one (0: none).
            min_p: f32 = 0.05, from (f32) by probability, off 0.0;
            /// Locally typical sampling mass (1: off).
            typical_p: f32 = 1.0, from (f32) by probability, off 1.0;
            /// Divides the logits of tokens seen in the window (1: off).
            repeat_penalty: f32 = 1.0, from (f32) by finite, off 1.0;
            /// Subtracted per occurrence in the window (0: off).
            frequency_penalty: f32 = 0.0, from (f32) by finite, off 0.0;
            /// Subtracted once for tokens present in the window (0: off).
            presence_penalty: f32 = 0.0, from (f32) by finite, off 0.0;
            /// The window of last tokens the penalties look at (0: off).
            penalty_last_n: i32 = 64, from (i32) by penalty_window, off 0;
            /// Token id to a value added to its logit.
            logit_bias: BTreeMap<i32, f32> = None, from (Option<BTreeMap<i32, f32>>) by logit_bias, off BTreeMap::new();
            /// The random generator's seed; None draws one.
            seed: Option<u32> = None, from (Option<u32>) by seed, off None;
        }
    };
}

/// What `SamplingParams` is, for the Rust struct and the Python class alike.
#[macro_export]
macro_rules! sampling_params_doc {
    () => {
        "How a request samples: `temperature` 0 is greedy (penalties and `logit_bias` still \
         apply); otherwise the candidates pass `top_k` (0: all), `typical_p`, `top_p` and `min_p` \
         (1, 1 and 0 switch them off), are scaled by the temperature and drawn with `seed` (None: \
         random). Penalties look at the last `penalty_last_n` tokens (1 and 0 switch them off). \
         `logit_bias` maps token ids to values added to their logits (`-inf` bans a token). \
         The defaults are llama.cpp's (`common/common.h`)."
    };
}

macro_rules! declare_sampling_params {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $kept:ty = $default:tt, from ($argument:ty) by $check:ident, off $off:expr;
    )*) => {
        #[doc = sampling_params_doc!()]
        #[derive(Debug, Clone)]
        pub struct SamplingParams {
            $( $(#[doc = $doc])* pub $name: $kept, )*
        }

        impl SamplingParams {
            /// Greedy, with nothing else: what `generate` does by default.
            #[must_use]
            pub fn greedy() -> Self {
                Self { $( $name: $off, )* }
            }
        }
    };
}
sampling_param_list!(declare_sampling_params);

/// The checks that turn a constructor's argument into the value kept, by field.
pub mod checks {
    use std::collections::BTreeMap;

    use super::RANDOM_SEED;
    use crate::errors::{Error, Result};
    pub use crate::sampler::{finite, probability};

    /// Finite and not negative (`sampler::temperature` rounds tiny ones to 0).
    pub fn temperature(name: &str, value: f32) -> Result<f32> {
        let value = crate::sampler::temperature(name, value)?;
        if value < 0.0 {
            return Err(Error::value(format!("{name} must be >= 0, got {value}")));
        }
        Ok(value)
    }

    pub fn top_k(name: &str, value: i32) -> Result<i32> {
        if value < 0 {
            return Err(Error::value(format!(
                "{name} must be >= 0 (0 keeps every token), got {value}"
            )));
        }
        Ok(value)
    }

    pub fn penalty_window(name: &str, value: i32) -> Result<i32> {
        crate::sampler::window(name, value, 0)
    }

    /// Biases by token id (None: none); a NaN bias would make every comparison false.
    pub fn logit_bias(_name: &str, biases: Option<BTreeMap<i32, f32>>) -> Result<BTreeMap<i32, f32>> {
        let biases = biases.unwrap_or_default();
        match biases.iter().find(|(_, bias)| bias.is_nan()) {
            Some((token, _)) => Err(Error::value(format!("the bias of token {token} is NaN"))),
            None => Ok(biases),
        }
    }

    pub fn seed(_name: &str, seed: Option<u32>) -> Result<Option<u32>> {
        if seed == Some(RANDOM_SEED) {
            return Err(Error::value(format!(
                "seed {RANDOM_SEED} means 'random' to llama.cpp: pass None for that"
            )));
        }
        Ok(seed)
    }
}

impl SamplingParams {
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
