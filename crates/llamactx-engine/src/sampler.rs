//! llama.cpp's token samplers: picking a token from logits, and the checks of sampler
//! settings. `LlamaSampler`, built with the crate's constructors, is in `python.rs`.

use llama_cpp_4::sampling::LlamaSampler;
use llama_cpp_4::token::data::LlamaTokenData;
use llama_cpp_4::token::data_array::LlamaTokenDataArray;
use llama_cpp_4::token::LlamaToken;

use crate::errors::{shim_error, Error, ExcClass, Result};
use crate::open_context::OpenContext;

pub mod backend_stages;
pub mod custom;
pub mod guidance;
pub mod lazy_grammar;
pub mod params;

pub struct SendSampler(pub LlamaSampler);

// SAFETY: `LlamaSampler` is `!Send` only because it owns a raw `llama_sampler*`. A sampler
// has no thread affinity; it must just not be used by two threads at once, which the
// `Mutex` in `PyLlamaSampler` guarantees.
unsafe impl Send for SendSampler {}

/// The token `sampler` selects from output row `row` (checked by `full_logits_row`) of
/// `native`: `llama_sampler_sample`'s steps, with its asserts turned into exceptions. Nothing
/// is accepted.
pub fn select(native: &OpenContext, sampler: &mut LlamaSampler, row: i32) -> Result<LlamaTokenData> {
    native.with(|context| select_from(sampler, context.get_logits_ith(row)))
}

/// The token `sampler` selects from `logits` (a row of the whole vocabulary), as `select`.
pub fn select_from(sampler: &mut LlamaSampler, logits: &[f32]) -> Result<LlamaTokenData> {
    let candidates = (0_i32..)
        .zip(logits)
        .map(|(token, &logit)| LlamaTokenData::new(LlamaToken::new(token), logit, 0.0));
    let mut candidates = LlamaTokenDataArray::from_iter(candidates, false);
    custom::take_failure();
    candidates.apply_sampler(sampler);
    if let Some(failure) = custom::take_failure() {
        return Err(failure);
    }
    let chosen = candidates
        .selected
        .and_then(|i| candidates.data.get(i).copied())
        .ok_or_else(|| {
            Error::value(
                "the sampler selected no token: end it with a selecting stage (greedy(), dist(), \
                 mirostat(), mirostat_v2() or adaptive_p()), e.g. chain([top_k(40), dist(seed)])",
            )
        })?;
    if chosen.logit() == f32::NEG_INFINITY {
        return Err(no_token_left());
    }
    Ok(chosen)
}

/// The error of a sampler that ruled out every token.
pub fn no_token_left() -> Error {
    Error::llama(
        ExcClass::ShimError,
        "Failed",
        None,
        "no candidate is left that the sampler allows (a grammar after top_k/top_p/min_p may \
         have ruled out every token they kept: put the grammar first)",
    )
}

/// Whether `sampler` would rule `token` out now, tried on a copy (samplers have state).
///
/// A grammar that is not complete aborts the process (`GGML_ABORT`, not an exception) when it
/// is made to accept an end-of-generation token; applied to candidates, it just masks the
/// token. So end-of-generation tokens are tried on a clone before they are accepted.
/// `ShimError` when `token`, an end of generation, would end a grammar that is not complete
/// (llama.cpp aborts the process then).
pub fn refuse_unfinished_end(end_of_generation: bool, sampler: &LlamaSampler, token: LlamaToken) -> Result<()> {
    if end_of_generation && rejects(sampler, token) {
        return Err(Error::llama(
            ExcClass::ShimError,
            "Failed",
            None,
            format!(
                "the grammar does not accept the end-of-generation token {} here",
                token.0
            ),
        ));
    }
    Ok(())
}

/// `llama_sampler_accept` with its failures as errors: a grammar that refuses `token` (the
/// crate's shim), or a lazy grammar whose replay failed inside its C callback. A grammar that
/// failed is left unusable by llama.cpp: the caller must not use the sampler again.
pub fn try_accept(sampler: &mut LlamaSampler, token: LlamaToken) -> Result<()> {
    custom::take_failure();
    let failure = sampler.try_accept(token).map_err(shim_error).err();
    failure.or_else(custom::take_failure).map_or(Ok(()), Err)
}

fn rejects(sampler: &LlamaSampler, token: LlamaToken) -> bool {
    let mut probe = sampler.clone_sampler();
    let mut candidates = LlamaTokenDataArray::new(vec![LlamaTokenData::new(token, 0.0, 0.0)], false);
    candidates.apply_sampler(&mut probe);
    candidates
        .data
        .first()
        .is_none_or(|data| data.logit() == f32::NEG_INFINITY)
}

pub fn probability(name: &str, p: f32) -> Result<f32> {
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(Error::value(format!("{name} must be in [0, 1], got {p}")))
    }
}

/// A parameter that must be a finite number: NaN or infinity quietly yields degenerate output.
pub fn finite(name: &str, value: f32) -> Result<f32> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(Error::value(format!("{name} must be a finite number, got {value}")))
    }
}

/// Temperatures below this pick as temperature 0 does (only the most likely token). It already
/// gives that token nearly all the probability, and far smaller ones divide the logits past
/// `f32::MAX`: infinities, then NaN probabilities, and llama.cpp picks an arbitrary token.
pub const MIN_TEMPERATURE: f32 = 1e-6;

/// A finite temperature `t`, 0 when it is below `MIN_TEMPERATURE` (negative ones are
/// llama.cpp's "keep the most likely token" already, for the samplers that take them).
pub fn temperature(name: &str, t: f32) -> Result<f32> {
    let t = finite(name, t)?;
    Ok(if (0.0..MIN_TEMPERATURE).contains(&t) { 0.0 } else { t })
}

/// The longest token window a sampler may keep: llama.cpp allocates it up front (and again
/// on every copy), so a typo must not ask for gigabytes.
const MAX_WINDOW: i32 = 1 << 20;

pub fn window(name: &str, n: i32, low: i32) -> Result<i32> {
    if (low..=MAX_WINDOW).contains(&n) {
        Ok(n)
    } else {
        Err(Error::value(format!("{name} must be in {low}..={MAX_WINDOW}, got {n}")))
    }
}
