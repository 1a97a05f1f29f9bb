"""Speculative decoding (``speculative=NgramDraft()`` or ``DraftModel(...)``, in the engine and
in ``generate``, ``stream``, ``chat`` and ``ChatSession``): the output equals decoding without
drafts, token for token, for every kind of request (greedy and seeded sampling, stop strings,
``max_tokens``, JSON Schemas, log-probabilities, cancellation, the prefix cache, the end of a
sequence's cells), while drafts are proposed, accepted and rejected. Most tests run with both
kinds of draft; the draft model is SmolLM2 cut to its first layers, which agrees with it on
some tokens only. Sampled continuations with and without drafts pass a two-sample test of one
distribution."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import synthetic
from serving import ENGINE_OPTIONS, MODEL_ID, running_server
from support.prompts import HELPFUL
from support.speculation import FREE, GROUNDED, OPTIONS, QUOTE, QUOTED_TEXTS, RECORDS, same_output

import llamactx


@pytest.fixture(scope="module", params=["ngram", "draft_model"])
def drafting(request: pytest.FixtureRequest) -> llamactx.NgramDraft | llamactx.DraftModel:
    """Each kind of draft, at every step, so that every test verifies drafts, whatever drafting
    measures on this machine (the default drafts only where it measured faster)."""
    if request.param == "ngram":
        return llamactx.NgramDraft(only_where_faster=False)
    return llamactx.DraftModel(request.getfixturevalue("draft_model"), only_where_faster=False)


@pytest.fixture(scope="module")
def plain(model: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(model, **OPTIONS) as engine:
        yield engine


@pytest.fixture(scope="module")
def speculative(
    model: llamactx.LlamaModel, drafting: llamactx.NgramDraft | llamactx.DraftModel
) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(model, speculative=drafting, **OPTIONS) as engine:
        yield engine


def test_greedy_output_equals_decoding_without_drafts_for_a_mix_of_requests(
    plain: llamactx.Engine, speculative: llamactx.Engine
) -> None:
    # Submitted together, so drafts share decodes with the other requests' tokens (with a KV
    # stream per sequence, a step drafts as many tokens for each request, or none).
    requests = [
        speculative.submit_chat(GROUNDED, max_tokens=240),
        speculative.submit_chat(FREE, max_tokens=120),
        speculative.submit(RECORDS, max_tokens=60),
    ]
    drafted = [request.result() for request in requests]
    alone = [
        plain.submit_chat(GROUNDED, max_tokens=240).result(),
        plain.submit_chat(FREE, max_tokens=120).result(),
        plain.submit(RECORDS, max_tokens=60).result(),
    ]
    for with_drafts, without in zip(drafted, alone, strict=True):
        same_output(with_drafts, without)
        assert without.drafted_tokens == without.accepted_tokens == 0
    grounded = drafted[0]
    assert "format_receipt(items, tax_rate)" in grounded.text  # it quotes its input
    # Drafts were accepted and rejected: both paths of the verification ran.
    assert 0 < grounded.accepted_tokens < grounded.drafted_tokens
    # Each accepted token saved a decode: fewer decodes than tokens (n-gram drafts measured
    # about half of the tokens accepted, the cut draft model about a quarter).
    assert grounded.accepted_tokens > grounded.completion_tokens // 8


def test_a_reply_quoting_its_input_is_drafted_from_the_place_it_quotes(
    model: llamactx.LlamaModel, plain: llamactx.Engine
) -> None:
    # The text repeats many 3-token runs ("the", "of the", ", and"): the lookup follows the
    # repeat that reaches furthest back, which is the place in the prompt being quoted, so
    # nearly every draft is accepted whole and most tokens need no decode of their own.
    without = plain.submit_chat(QUOTE, max_tokens=300).result()
    assert without.text.strip() == QUOTED_TEXTS[0]
    with llamactx.Engine(model, speculative=llamactx.NgramDraft(only_where_faster=False), **OPTIONS) as engine:
        quoted = engine.submit_chat(QUOTE, max_tokens=300).result()
    same_output(quoted, without)
    assert quoted.accepted_tokens >= 0.85 * quoted.completion_tokens
    assert quoted.accepted_tokens >= 0.9 * quoted.drafted_tokens


def test_stop_strings_and_max_tokens_end_the_reply_inside_a_draft(
    plain: llamactx.Engine, speculative: llamactx.Engine
) -> None:
    for max_tokens in (1, 2, 5, 23, 64):
        same_output(
            speculative.submit(RECORDS, max_tokens=max_tokens).result(),
            plain.submit(RECORDS, max_tokens=max_tokens).result(),
        )
    # Stop strings the reply reaches (its greedy text: " Charlie\nAge: 28\nCity: New York\n\nName:
    # David\nAge: 42\nCity: Sydney..."), within a token and across tokens.
    for stop in ("City: New", "\n\nName: D", ["Sydney", "Age: 4"]):
        with_drafts = speculative.submit(RECORDS, max_tokens=100, stop=stop).result()
        same_output(with_drafts, plain.submit(RECORDS, max_tokens=100, stop=stop).result())
        assert with_drafts.finish_reason == "stop"
    counted = speculative.submit(RECORDS, max_tokens=23).result()
    assert counted.completion_tokens == 23
    assert counted.accepted_tokens > 0


def test_json_schema_and_grammar_constraints_hold_across_drafts(
    plain: llamactx.Engine, speculative: llamactx.Engine
) -> None:
    schema = {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "price": {"type": "number"}},
            "required": ["name", "price"],
        },
        "minItems": 6,
        "maxItems": 6,
    }
    prompt = "A JSON list of six fruits with prices:"
    with_drafts = speculative.submit(prompt, max_tokens=200, json_schema=schema).result()
    same_output(with_drafts, plain.submit(prompt, max_tokens=200, json_schema=schema).result())
    assert with_drafts.drafted_tokens > 0
    grammar = 'root ::= ("ab" | "abc")+ "."'
    with_drafts = speculative.submit("Letters:", max_tokens=40, grammar=grammar).result()
    same_output(with_drafts, plain.submit("Letters:", max_tokens=40, grammar=grammar).result())
    assert set(with_drafts.text) <= set("abc.")


def test_log_probabilities_are_those_of_decoding_without_drafts(
    plain: llamactx.Engine, speculative: llamactx.Engine
) -> None:
    with_drafts = speculative.submit(RECORDS, max_tokens=40, logprobs=3).result()
    without = plain.submit(RECORDS, max_tokens=40, logprobs=3).result()
    same_output(with_drafts, without)
    assert with_drafts.accepted_tokens > 0
    for drafted_row, plain_row in zip(with_drafts.logprobs, without.logprobs, strict=True):
        assert [token for token, _ in drafted_row] == [token for token, _ in plain_row]
        np.testing.assert_allclose([p for _, p in drafted_row], [p for _, p in plain_row], atol=1e-4)


def test_seeded_sampling_draws_what_decoding_without_drafts_draws(
    plain: llamactx.Engine, speculative: llamactx.Engine
) -> None:
    """Every token is still drawn by the request's own sampler, once, from the same output:
    with a seed, each draw equals the draw without drafts, so the distribution of outputs is
    the model's (the point-mass case of the rejection rule: a drafted token is kept exactly when
    it is the token drawn)."""
    accepted = drafted = 0
    outputs = set()
    for seed in range(24):
        sampling = llamactx.SamplingParams(temperature=1.0, seed=seed)
        with_drafts = speculative.submit(RECORDS, max_tokens=12, sampling=sampling).result()
        same_output(with_drafts, plain.submit(RECORDS, max_tokens=12, sampling=sampling).result())
        accepted += with_drafts.accepted_tokens
        drafted += with_drafts.drafted_tokens
        outputs.add(with_drafts.text)
    assert 0 < accepted < drafted
    assert len(outputs) > 1, "the draws differ between seeds"


def test_a_cancelled_request_leaves_no_drafted_cells_behind(
    plain: llamactx.Engine, speculative: llamactx.Engine
) -> None:
    request = speculative.submit_chat(GROUNDED, max_tokens=240)
    pieces = iter(request)
    first = next(pieces)
    request.cancel()
    cancelled = request.result()
    assert cancelled.finish_reason == "cancelled"
    full = plain.submit_chat(GROUNDED, max_tokens=240).result()
    assert first
    assert full.text.startswith(cancelled.text)
    assert full.tokens[: len(cancelled.tokens)] == cancelled.tokens
    # The next request in the freed sequence decodes as on a clean one.
    same_output(speculative.submit(RECORDS, max_tokens=30).result(), plain.submit(RECORDS, max_tokens=30).result())
    assert speculative.stats()["kv_cells_used"] == 0


def test_drafts_never_pass_the_end_of_a_sequence(
    model: llamactx.LlamaModel, drafting: llamactx.NgramDraft | llamactx.DraftModel
) -> None:
    prompt = model.str_to_token(RECORDS, model.add_bos_token())
    prompt = prompt * (230 // len(prompt))  # 20-odd cells left of 256
    options: dict[str, Any] = {"n_ctx": 256, "n_seq_max": 1, "prefix_cache": False}
    with (
        llamactx.Engine(model, **options) as without,
        llamactx.Engine(model, speculative=drafting, **options) as with_drafts,
    ):
        drafted = with_drafts.submit(prompt, max_tokens=100).result()
        same_output(drafted, without.submit(prompt, max_tokens=100).result())
    assert drafted.finish_reason == "length"
    assert len(prompt) + drafted.completion_tokens == options["n_ctx"]
    assert drafted.accepted_tokens > 0


def conversation(engine: llamactx.Engine) -> list[llamactx.Completion]:
    """Two turns of a chat: the second reuses the first's cells."""
    first = engine.submit_chat(GROUNDED, max_tokens=200).result()
    turn = [*GROUNDED, {"role": "assistant", "content": first.text}, {"role": "user", "content": "Again."}]
    return [first, engine.submit_chat(turn, max_tokens=120).result()]


def test_the_prefix_cache_reuses_cells_of_verified_drafts(
    model: llamactx.LlamaModel, drafting: llamactx.NgramDraft | llamactx.DraftModel
) -> None:
    # Reused cells were computed in other chunks than a fresh read's, so the comparison is
    # with the same conversation on an engine with the prefix cache and no drafts.
    options: dict[str, Any] = {"n_ctx": 4096, "n_seq_max": 4}
    with llamactx.Engine(model, speculative=drafting, **options) as cached:
        drafted = conversation(cached)
        stats = cached.stats()
    with llamactx.Engine(model, **options) as cached:
        alone = conversation(cached)
    assert drafted[1].cached_tokens == alone[1].cached_tokens > 0
    for with_drafts, without in zip(drafted, alone, strict=True):
        same_output(with_drafts, without)
    assert stats["drafted_tokens"] == sum(completion.drafted_tokens for completion in drafted)
    assert stats["accepted_tokens"] == sum(completion.accepted_tokens for completion in drafted) > 0


def test_speculative_options_are_checked(model: llamactx.LlamaModel, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="size_ngram"):
        llamactx.NgramDraft(size_ngram=0)
    with pytest.raises(ValueError, match="size_mgram"):
        llamactx.NgramDraft(size_ngram=4, size_mgram=2)
    with pytest.raises(ValueError, match="size_mgram"):
        llamactx.NgramDraft(size_mgram=100_000)
    with pytest.raises(TypeError, match="NgramDraft, a DraftModel"):
        llamactx.Engine(model, speculative="ngram")  # type: ignore[arg-type]
    mamba = llamactx.LlamaModel.load_from_file(synthetic.write_tiny_mamba(tmp_path / "mamba.gguf"))
    with pytest.raises(ValueError, match="recurrent"):
        llamactx.Engine(mamba, speculative=llamactx.NgramDraft(), n_ctx=256)


@pytest.mark.parametrize("kind", ["--spec-ngram", "--draft-model"])
def test_the_server_with_speculation_answers_as_without_and_exports_the_counts(
    model_path: Path, model: llamactx.LlamaModel, draft_model_path: Path, kind: str
) -> None:
    with llamactx.Engine(model, **ENGINE_OPTIONS) as reference:
        expected = reference.submit_chat(GROUNDED, max_tokens=120).result()
    options = [kind] if kind == "--spec-ngram" else [kind, str(draft_model_path)]
    with running_server(model_path, "--no-prefix-cache", *options) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        reply = client.chat.completions.create(
            model=MODEL_ID,
            messages=GROUNDED,
            max_tokens=120,
            temperature=0,  # type: ignore[arg-type]
        )
        metrics = server.metrics()
    assert reply.choices[0].message.content == expected.text
    # The default drafts where it measures faster: at least its first steps draft, to measure.
    assert metrics["llamactx_engine_drafted_tokens_total"] >= metrics["llamactx_engine_accepted_tokens_total"]
    assert metrics["llamactx_engine_drafted_tokens_total"] > 0


def decodes(ctx: llamactx.LlamaContext) -> int:
    """One-token decodes since the last reset: drafts make fewer of them."""
    return ctx.timings().n_eval


def test_generate_stream_and_chat_with_drafts_equal_them_without(
    model: llamactx.LlamaModel, drafting: llamactx.NgramDraft | llamactx.DraftModel
) -> None:
    draft = drafting
    with model.new_context(n_ctx=2048) as ctx:
        for max_tokens in (0, 1, 5, 80):
            ctx.perf_context_reset()
            without = llamactx.generate(ctx, RECORDS, max_tokens=max_tokens)
            single = decodes(ctx)
            ctx.perf_context_reset()
            assert llamactx.generate(ctx, RECORDS, max_tokens=max_tokens, speculative=draft) == without
            if max_tokens == 80:
                assert decodes(ctx) < single
        stop = "City: New"
        streamed = list(llamactx.stream(ctx, RECORDS, max_tokens=80, stop=[stop], speculative=draft))
        assert "".join(streamed) == llamactx.generate(ctx, RECORDS, max_tokens=80, stop=[stop])
        assert stop not in "".join(streamed)
        schema = {"type": "array", "items": {"type": "string"}, "minItems": 5, "maxItems": 5}
        prompt = "Five fruits as a JSON list:"
        assert llamactx.generate(ctx, prompt, max_tokens=80, json_schema=schema, speculative=draft) == (
            llamactx.generate(ctx, prompt, max_tokens=80, json_schema=schema)
        )
        assert llamactx.chat(ctx, GROUNDED, max_tokens=120, speculative=draft) == llamactx.chat(
            ctx, GROUNDED, max_tokens=120
        )
    replies = []
    for speculative in (None, draft):
        with model.new_context(n_ctx=2048) as ctx:
            session = llamactx.ChatSession(ctx, system=HELPFUL, max_tokens=80)
            replies.append(
                [
                    "".join(session.send(text, speculative=speculative))
                    for text in (GROUNDED[1]["content"], "Now repeat only its last line.")
                ]
            )
    assert replies[0] == replies[1]


def test_a_stream_closed_early_leaves_the_kv_cache_holding_its_history(
    model: llamactx.LlamaModel, drafting: llamactx.NgramDraft | llamactx.DraftModel
) -> None:
    prompt = model.str_to_token(RECORDS, model.add_bos_token())
    with model.new_context(n_ctx=2048) as ctx:
        for read in range(1, 25):  # closed after each piece in turn: some while drafts wait
            ctx.clear_kv_cache()
            history = list(prompt)
            llamactx.prefill(ctx, history, 0)
            pieces = llamactx.continue_sequence(
                ctx, history, max_tokens=40, sampler=llamactx.LlamaSampler.greedy(), speculative=drafting
            )
            for _ in range(read):
                next(pieces)
            pieces.close()
            assert ctx.kv_cache_seq_pos_max(0) == len(history) - 1, read


def test_generation_with_drafts_refuses_a_recurrent_model(tmp_path: Path) -> None:
    mamba = llamactx.LlamaModel.load_from_file(synthetic.write_tiny_mamba(tmp_path / "mamba.gguf"))
    assert mamba.is_recurrent()
    assert not mamba.is_hybrid()
    with mamba.new_context(n_ctx=256) as ctx, pytest.raises(ValueError, match="recurrent"):
        llamactx.generate(ctx, [1, 2, 3], max_tokens=4, speculative=llamactx.NgramDraft())


def _chi_square(codes: np.ndarray, split: int, categories: int) -> float:
    """Pearson's two-sample chi-square statistic of outcomes ``codes[:split]`` against
    ``codes[split:]`` (each a category index below ``categories``)."""
    observed = np.stack(
        [np.bincount(codes[:split], minlength=categories), np.bincount(codes[split:], minlength=categories)]
    )
    expected = observed.sum(axis=1, keepdims=True) * observed.sum(axis=0) / observed.sum()
    kept = expected.sum(axis=0) > 0
    return float((((observed - expected) ** 2)[:, kept] / expected[:, kept]).sum())


def _same_distribution_p(first: list[str], second: list[str], permutations: int = 2000) -> float:
    """The permutation test's p-value of ``first`` and ``second`` being draws of one
    distribution, by the chi-square statistic (outcomes seen fewer than 10 times in both together
    pooled into one category, so no expected count is tiny)."""
    pooled = first + second
    common = sorted(outcome for outcome, count in Counter(pooled).items() if count >= 10)
    index = {outcome: position for position, outcome in enumerate(common)}
    codes = np.array([index.get(outcome, len(common)) for outcome in pooled])
    categories = len(common) + 1
    observed = _chi_square(codes, len(first), categories)
    shuffle = np.random.default_rng(0)
    exceed = sum(
        _chi_square(shuffle.permutation(codes), len(first), categories) >= observed for _ in range(permutations)
    )
    return (exceed + 1) / (permutations + 1)


def _continuations(engine: llamactx.Engine, seeds: range, temperature: float) -> list[llamactx.Completion]:
    """8-token continuations of ``RECORDS``, one drawn with each seed, all submitted at once."""
    requests = [
        engine.submit(RECORDS, max_tokens=8, sampling=llamactx.SamplingParams(temperature=temperature, seed=seed))
        for seed in seeds
    ]
    return [request.result() for request in requests]


def test_sampled_continuations_follow_the_models_distribution_with_drafts(model: llamactx.LlamaModel) -> None:
    """The issue's statistical test: continuations drawn with drafts (one set of seeds) and
    without (another) are draws of one distribution, by a permutation test of the chi-square
    statistic; draws at another temperature are told apart by the same test, so it has the
    power to see a skew that drafting would bring."""
    draws = 300
    options = {**OPTIONS, "prefix_cache": True}
    # Repeats of one token draft: the labels' drafts are accepted, the values' mostly rejected.
    drafting = llamactx.NgramDraft(size_ngram=1, only_where_faster=False)
    with llamactx.Engine(model, speculative=drafting, **options) as engine:
        drafted = _continuations(engine, range(draws), 1.0)
    assert 0 < sum(c.accepted_tokens for c in drafted) < sum(c.drafted_tokens for c in drafted)
    with llamactx.Engine(model, **options) as engine:
        without = _continuations(engine, range(10_000, 10_000 + draws), 1.0)
        colder = _continuations(engine, range(20_000, 20_000 + draws), 0.5)
    texts = [completion.text for completion in drafted]
    assert _same_distribution_p(texts, [completion.text for completion in without]) > 0.01
    assert _same_distribution_p(texts, [completion.text for completion in colder]) < 0.001
