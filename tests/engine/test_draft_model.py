"""Speculative decoding with a draft model (``DraftModel``), beyond what ``test_speculative``
checks for every kind of draft: a model drafting for itself, sampled outputs that follow the
target model's distribution, and draft models that cannot draft, for the API and ``llamactx
serve --draft-model``."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import synthetic
from support.decoding import decode_prompt
from support.speculation import GROUNDED, OPTIONS, same_greedy_output

import llamactx

#: Seeded draws of a three-token continuation, for the distribution test.
DRAWS = 400
#: Candidates each draw keeps (top_k): few, so that every continuation is counted often.
TOP_K = 3
#: High, so that the draft model's greedy token is often not the one drawn.
TEMPERATURE = 1.5
#: A prompt of many likely continuations.
OPEN_PROMPT = "My favourite colour is"


@pytest.fixture(scope="module")
def plain(model: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(model, **OPTIONS) as engine:
        yield engine


def test_a_model_drafting_for_itself_has_nearly_every_draft_accepted(
    model: llamactx.LlamaModel, plain: llamactx.Engine
) -> None:
    with llamactx.Engine(model, speculative=llamactx.DraftModel(model, only_where_faster=False), **OPTIONS) as engine:
        drafted = engine.submit_chat(GROUNDED, max_tokens=120).result()
        stats = engine.stats()
    without = plain.submit_chat(GROUNDED, max_tokens=120).result()
    same_greedy_output(model, plain.chat_tokens(GROUNDED), drafted, without)
    # Its greedy drafts are the target's greedy tokens, but where a different batch shape
    # turns a near-tie.
    assert drafted.drafted_tokens > drafted.completion_tokens // 2
    assert drafted.accepted_tokens >= 0.95 * drafted.drafted_tokens
    assert (stats.drafted_tokens, stats.accepted_tokens) == (drafted.drafted_tokens, drafted.accepted_tokens)


def top_probabilities(ctx: llamactx.LlamaContext, tokens: list[int]) -> dict[int, float]:
    """The ``TOP_K`` most likely tokens after ``tokens`` and their probabilities at
    ``TEMPERATURE`` among those (what the draws sample from)."""
    ctx.clear_kv_cache()
    decode_prompt(ctx, tokens)
    logits = ctx.get_logits_ith(-1).astype(np.float64)
    top = np.argsort(logits)[::-1][:TOP_K]
    weights = np.exp((logits[top] - logits[top[0]]) / TEMPERATURE)
    return {int(token): float(weight) for token, weight in zip(top, weights / weights.sum(), strict=True)}


def continuation_probabilities(model: llamactx.LlamaModel, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """The probability of every continuation of ``prompt`` of up to three tokens that the draws
    can make, by its tokens (an end of generation ends it, and is not among its tokens)."""
    ended: dict[tuple[int, ...], float] = {}
    growing: dict[tuple[int, ...], float] = {(): 1.0}
    with model.new_context(n_ctx=512) as ctx:
        for _ in range(3):
            longer = {}
            for start, p in growing.items():
                for token, q in top_probabilities(ctx, [*prompt, *start]).items():
                    if model.is_eog_token(token):
                        ended[start] = p * q
                    else:
                        longer[(*start, token)] = p * q
            growing = longer
    return {**ended, **growing}


def chi_square_survival(statistic: float, degrees: int) -> float:
    """P(X >= statistic) for X chi-square distributed with ``degrees`` degrees of freedom: the
    regularized upper incomplete gamma function Q(degrees / 2, statistic / 2), by its series."""
    a, z = degrees / 2, statistic / 2
    if z == 0:
        return 1.0
    if z > 10 * (a + 10):
        return 0.0  # below 1e-40, where the series would overflow
    term = total = 1 / a
    n = 0
    while term > total * 1e-16:
        n += 1
        term *= z / (a + n)
        total += term
    return 1 - total * math.exp(-z + a * math.log(z) - math.lgamma(a))


def test_the_chi_square_survival_function_matches_known_quantiles() -> None:
    # Tables: the 95th percentile of chi-square with 1, 5 and 20 degrees of freedom.
    for statistic, degrees in ((3.841, 1), (11.070, 5), (31.410, 20)):
        assert chi_square_survival(statistic, degrees) == pytest.approx(0.05, abs=1e-4)
    assert chi_square_survival(0.0, 3) == 1.0


def test_sampled_continuations_follow_the_models_distribution(
    model: llamactx.LlamaModel, draft_model: llamactx.LlamaModel
) -> None:
    """Drafts only change which tokens a decode computes: each token is drawn from the target
    model's output for the tokens before it, and a drafted token is kept exactly when it is
    the token drawn. Over many seeds, the continuations' frequencies are the target model's
    probabilities (chi-square), though the third token is often drawn from a drafted token's
    output."""
    prompt = model.str_to_token(OPEN_PROMPT, model.add_bos_token())
    expected = continuation_probabilities(model, prompt)
    drafting = llamactx.DraftModel(draft_model, only_where_faster=False)
    with llamactx.Engine(model, speculative=drafting, n_ctx=4096, n_seq_max=8) as engine:
        requests = [
            engine.submit(
                prompt,
                max_tokens=3,
                sampling=llamactx.SamplingParams(temperature=TEMPERATURE, top_k=TOP_K, top_p=1.0, min_p=0.0, seed=seed),
            )
            for seed in range(DRAWS)
        ]
        completions = [request.result() for request in requests]
    assert 0 < sum(c.accepted_tokens for c in completions) < sum(c.drafted_tokens for c in completions)
    observed = Counter(tuple(completion.tokens) for completion in completions)
    assert set(observed) <= set(expected), "every draw is one of the top-k continuations"
    assert len(observed) > 10
    # Continuations expected at least 5 times are their own category; the others share one.
    common = [continuation for continuation, p in expected.items() if p * DRAWS >= 5]
    categories = [(observed[c], expected[c] * DRAWS) for c in common]
    rest_expected = DRAWS - sum(e for _, e in categories)
    categories.append((DRAWS - sum(o for o, _ in categories), rest_expected))
    statistic = sum((o - e) ** 2 / e for o, e in categories if e > 0)
    assert len(categories) > 10
    assert chi_square_survival(statistic, len(categories) - 1) > 1e-3, (statistic, categories)


def test_draft_models_that_cannot_draft_for_the_model_are_refused(
    model: llamactx.LlamaModel, model_path: Path, tmp_path: Path
) -> None:
    with pytest.raises(TypeError, match="LlamaModel"):
        llamactx.DraftModel("draft.gguf")  # type: ignore[arg-type]
    for bad in ({"n_draft_max": 0}, {"n_draft_max": 1000}, {"p_min": 1.5}, {"p_min": math.nan}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            llamactx.DraftModel(model, **bad)  # type: ignore[arg-type]
    renamed = synthetic.write_first_layers(model_path, tmp_path / "renamed.gguf", 2, rename=(1000, "<renamed>"))
    other_vocabulary = synthetic.write_vocabulary(tmp_path / "vocab.gguf", "llama", synthetic.spm_vocabulary())
    mamba = synthetic.write_tiny_mamba(tmp_path / "mamba.gguf")
    for path, why in (
        (renamed, "token 1000 has a different text"),
        (other_vocabulary, "different types"),
        (mamba, "recurrent"),
    ):
        draft = llamactx.DraftModel(llamactx.LlamaModel.load_from_file(path, vocab_only=path != mamba))
        with pytest.raises(ValueError, match=why):
            llamactx.Engine(model, speculative=draft, n_ctx=512)
        with model.new_context(n_ctx=512) as ctx, pytest.raises(ValueError, match=why):
            llamactx.generate(ctx, "Hello", max_tokens=4, speculative=draft)


def serve_status(model_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "llamactx", "serve", "--model", str(model_path), "--port", "0", *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_serve_refuses_speculative_options_that_do_not_fit_as_usage_errors(
    model_path: Path, draft_model_path: Path, tmp_path: Path
) -> None:
    mamba = synthetic.write_tiny_mamba(tmp_path / "mamba.gguf")
    for options, why in (
        (["--spec-ngram", "--draft-model", str(draft_model_path)], "choose one"),
        (["--spec-ngram", "--spec-ngram-size-n", "8", "--spec-ngram-size-m", "4"], "size_mgram"),
        (["--draft-model", str(mamba)], "recurrent"),
    ):
        finished = serve_status(model_path, *options)
        assert finished.returncode == 2, finished.stderr
        assert why in finished.stderr
        assert "Traceback" not in finished.stderr
