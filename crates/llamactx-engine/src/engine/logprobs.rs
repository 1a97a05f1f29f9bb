//! Top log-probabilities of a sampled token under the model's own distribution (the raw
//! logits, before sampling changed them), as OpenAI's `logprobs`/`top_logprobs` report them.

/// The most alternatives a request may ask for (OpenAI's limit).
pub const MAX_TOP: usize = 20;

/// `(token, log-probability)` of `chosen`, then of the `top` most likely tokens other than it,
/// most likely first.
pub fn top_logprobs(logits: &[f32], chosen: i32, top: usize) -> Vec<(i32, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&logit| f64::from(logit - max).exp()).sum();
    #[allow(clippy::cast_possible_truncation)] // a log-probability fits an f32
    let log_norm = max + sum.ln() as f32;
    let logprob = |token: usize| logits.get(token).map_or(f32::NEG_INFINITY, |&logit| logit - log_norm);
    let mut best: Vec<usize> = Vec::with_capacity(top + 1);
    for (token, &logit) in logits.iter().enumerate() {
        if best.len() == top + 1 && best.last().is_some_and(|&last| logits[last] >= logit) {
            continue;
        }
        let at = best.partition_point(|&other| logits[other] >= logit);
        best.insert(at, token);
        best.truncate(top + 1);
    }
    let chosen_index = usize::try_from(chosen).unwrap_or(usize::MAX);
    std::iter::once(chosen_index)
        .chain(best.into_iter().filter(|&token| token != chosen_index).take(top))
        .filter_map(|token| Some((i32::try_from(token).ok()?, logprob(token))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::top_logprobs;

    #[test]
    fn the_chosen_token_then_the_most_likely_others() {
        let logits = [0.0f32, 2.0, 1.0, 3.0];
        let picked = top_logprobs(&logits, 2, 2);
        let tokens: Vec<i32> = picked.iter().map(|&(token, _)| token).collect();
        assert_eq!(tokens, [2, 3, 1]);
        let total: f32 = logits.iter().map(|&logit| logit.exp()).sum();
        assert!((picked[0].1 - (1.0f32.exp() / total).ln()).abs() < 1e-6);
        assert!(picked.windows(2).skip(1).all(|pair| pair[0].1 >= pair[1].1));
        assert_eq!(top_logprobs(&logits, 3, 0).len(), 1);
    }
}
