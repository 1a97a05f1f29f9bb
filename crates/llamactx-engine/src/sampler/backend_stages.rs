//! What `set_sampler` checks of a sampler's stages before llama.cpp builds them into a backend
//! graph, where a stage that does not fit trips a `GGML_ASSERT`. llama.cpp runs the stages on
//! the backend up to the first one that only runs on the CPU; only those are checked.
//!
//! The rules come from llama.cpp's backend `apply` functions and were confirmed by setting
//! every chain of up to three of `temp`, `temp_ext`, `top_k`, `top_p`, `min_p`, `logit_bias`,
//! `penalties`, `dist`, `greedy` and `xtc` (and of up to four of six of them) on a context and
//! decoding, and by random chains with hostile parameters (a temperature of 0 or less keeps one
//! candidate): every chain that aborted breaks one of them.

use crate::errors::{Error, Result};

/// One stage of a sampler, as far as the backend checks care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Keeps the `k` most likely candidates (`k <= 0` keeps all).
    TopK(i32),
    /// Keeps the most likely candidates up to a probability mass.
    TopP,
    /// `logit_bias`: adds to candidates by token id, built for `n_vocab` tokens, up to token
    /// `max_token`.
    LogitBias { n_vocab: i32, max_token: Option<i32> },
    /// `penalties`: counts candidates by token id, built for `n_vocab` tokens.
    Penalties { n_vocab: i32 },
    /// `dist`: draws the token.
    Dist,
    /// Another stage that runs on the backend (`greedy` among them: stages after it work).
    Plain,
    /// A stage that runs on the CPU: it and the stages after it are not checked.
    Cpu,
}

impl Stage {
    /// `temp`/`temp_ext` at `t`: on the backend, a temperature of 0 or less keeps only the most
    /// likely candidate, as `top_k(1)` does.
    pub fn temperature(t: f32) -> Self {
        if t <= 0.0 {
            Stage::TopK(1)
        } else {
            Stage::Plain
        }
    }

    /// The vocabulary size a stage indexed by token id was built for.
    pub fn built_for(self) -> Option<i32> {
        match self {
            Stage::LogitBias { n_vocab, .. } | Stage::Penalties { n_vocab } => Some(n_vocab),
            _ => None,
        }
    }
}

/// The candidates llama.cpp's backend probe builds when a sampler is set [llama.cpp internal].
const PROBE_CANDIDATES: i32 = 128 * 1024;

/// The most stages run on the backend. llama.cpp sizes the probe graph it builds in
/// `set_sampler` for 2048 tensors (`GGML_DEFAULT_GRAPH_SIZE`) and asserts past them: 205 `dist`
/// stages or 228 `min_p` stages did.
const MAX_BACKEND_STAGES: usize = 64;

/// The most stages that gather candidates (`top_k`, `top_p`) on the backend: each leaves the
/// candidates one dimension deeper, and a third asserts on their shape.
const MAX_BACKEND_GATHERS: usize = 2;

/// `ValueError` for stages that would trip llama.cpp's asserts on the backend of a context of
/// `n_vocab` tokens: more than `MAX_BACKEND_STAGES`, a stage after `dist`, a third
/// `top_k`/`top_p`, a `top_k` larger than the candidates left, a stage indexed by token id
/// built for another vocabulary, or a `logit_bias` after a `top_k` or biasing a token past the
/// candidates left.
pub fn check_backend(stages: &[Stage], n_vocab: i32) -> Result<()> {
    let mut left = n_vocab.min(PROBE_CANDIDATES);
    let mut gathers = 0;
    let mut after_top_k = false;
    let mut drawn = false;
    for (index, &stage) in stages.iter().take_while(|&&stage| stage != Stage::Cpu).enumerate() {
        if index == MAX_BACKEND_STAGES {
            return Err(Error::value(format!(
                "a sampler runs at most {MAX_BACKEND_STAGES} stages on the backend (llama.cpp's graph \
                 for them has a fixed size)"
            )));
        }
        if drawn {
            return Err(Error::value("on the backend, dist must be the last stage"));
        }
        if let Some(built) = stage.built_for().filter(|&built| built != n_vocab) {
            return Err(Error::value(format!(
                "a stage was built for {built} tokens; the context's model has {n_vocab}"
            )));
        }
        match stage {
            Stage::Cpu | Stage::Plain | Stage::Penalties { .. } | Stage::TopK(i32::MIN..=0) => {}
            Stage::Dist => drawn = true,
            Stage::TopP => gathers += 1,
            Stage::TopK(k) => {
                if k > left {
                    return Err(Error::value(format!(
                        "top_k({k}) on the backend needs at least {k} candidates; {left} are left there"
                    )));
                }
                left = k;
                gathers += 1;
                after_top_k = true;
            }
            Stage::LogitBias { max_token, .. } => {
                if after_top_k {
                    return Err(Error::value(
                        "on the backend, logit_bias must come before top_k (it adds to candidates by token id)",
                    ));
                }
                if let Some(token) = max_token.filter(|&token| token >= left) {
                    return Err(Error::value(format!(
                        "a logit bias for token {token} on the backend, where only {left} candidates are left"
                    )));
                }
            }
        }
        if gathers > MAX_BACKEND_GATHERS {
            return Err(Error::value(format!(
                "a sampler runs at most {MAX_BACKEND_GATHERS} top_k/top_p stages on the backend"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const N_VOCAB: i32 = 1000;
    const BIAS: Stage = Stage::LogitBias {
        n_vocab: N_VOCAB,
        max_token: Some(5),
    };
    const PENALTIES: Stage = Stage::Penalties { n_vocab: N_VOCAB };

    fn fits(stages: &[Stage]) -> bool {
        check_backend(stages, N_VOCAB).is_ok()
    }

    #[test]
    fn takes_the_usual_chains() {
        assert!(fits(&[
            PENALTIES,
            Stage::TopK(40),
            Stage::TopP,
            Stage::Plain,
            Stage::Dist
        ]));
        assert!(fits(&[BIAS, Stage::TopK(40), Stage::Plain]));
        assert!(fits(&[
            Stage::Dist,
            Stage::Cpu,
            Stage::TopK(40),
            Stage::TopK(40),
            Stage::TopK(40)
        ]));
    }

    #[test]
    fn refuses_a_stage_after_dist() {
        assert!(!fits(&[Stage::Dist, Stage::Plain]));
        assert!(!fits(&[Stage::Dist, Stage::Dist]));
        assert!(fits(&[Stage::Plain, Stage::Plain, Stage::Dist]));
    }

    #[test]
    fn refuses_a_third_gathering_stage() {
        assert!(fits(&[Stage::TopK(40), Stage::TopP, Stage::Dist]));
        assert!(!fits(&[Stage::TopP, Stage::TopK(40), Stage::TopP]));
        assert!(fits(&[Stage::TopK(0), Stage::TopK(-1), Stage::TopK(40), Stage::TopP]));
    }

    #[test]
    fn refuses_a_logit_bias_after_top_k() {
        assert!(!fits(&[Stage::TopK(40), Stage::Plain, BIAS]));
        assert!(fits(&[Stage::TopK(40), PENALTIES]));
        assert!(fits(&[Stage::TopP, BIAS]));
    }

    #[test]
    fn refuses_more_stages_than_the_graph_holds() {
        assert!(fits(&[Stage::Plain; MAX_BACKEND_STAGES]));
        assert!(!fits(&[Stage::Plain; MAX_BACKEND_STAGES + 1]));
        let mut past_the_backend = vec![Stage::Cpu];
        past_the_backend.extend([Stage::Plain; MAX_BACKEND_STAGES + 1]);
        assert!(fits(&past_the_backend));
    }

    #[test]
    fn takes_a_temperature_of_zero_as_top_k_of_one() {
        assert!(fits(&[Stage::temperature(0.0), Stage::Plain]));
        assert!(!fits(&[Stage::temperature(0.0), Stage::TopK(40)]));
        assert!(!fits(&[Stage::temperature(-1.0), BIAS]));
        assert!(fits(&[Stage::temperature(0.8), Stage::TopK(40), Stage::TopP]));
    }

    #[test]
    fn refuses_what_does_not_fit_the_vocabulary() {
        assert!(!fits(&[Stage::TopK(N_VOCAB + 1)]));
        assert!(!fits(&[Stage::Penalties { n_vocab: N_VOCAB + 1 }]));
        assert!(!fits(&[Stage::TopK(4), Stage::TopP, BIAS]));
    }
}
