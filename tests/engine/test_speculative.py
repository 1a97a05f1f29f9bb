"""Speculative decoding in the engine (``speculative=NgramDraft()`` or ``DraftModel(...)``): the
output equals decoding without drafts, token for token, for every kind of request (greedy and
seeded sampling, stop strings, ``max_tokens``, JSON Schemas, log-probabilities, cancellation, the
prefix cache, the end of a sequence's cells), while drafts are proposed, accepted and rejected.
Tests run with both kinds of draft (the ``drafting`` fixture), or with the one whose own code
they reach beyond the verification both share; the draft model is SmolLM2 cut to its first
layers, which agrees with it on some tokens only. ``generate``, ``stream``, ``chat``
and ``ChatSession`` with drafts: ``test_speculative_generation.py``; the distribution of sampled
continuations: ``test_speculative_distribution.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from support import synthetic
from support.serving import ENGINE_OPTIONS, MODEL_ID, running_server
from support.speculation import (
    BATCHING_TOLERANCE,
    FREE,
    GROUNDED,
    OPTIONS,
    QUOTE,
    QUOTED_TEXTS,
    RECORDS,
    same_greedy_output,
    same_greedy_tokens,
    same_output,
    worst_greedy_gap,
)

import llamactx

# The module takes about 80 s of a parallel worker: started first (with the other long ones),
# so that it does not run alone at the end of the pass.
pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def plain(model: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(model, **OPTIONS) as engine:
        yield engine


Alone = Callable[..., llamactx.Completion]


@pytest.fixture(scope="module")
def alone(plain: llamactx.Engine) -> Alone:
    """A request's completion without drafts (a chat for a list of messages), computed once in
    the module: the tests of both kinds of draft compare with the same ones. Without the prefix
    cache, a request's greedy or seeded output on this engine does not depend on what ran
    before it, so a kept one is the one a new run would give."""
    kept: dict[str, llamactx.Completion] = {}

    def completion(prompt: str | list[dict[str, str]], **options: Any) -> llamactx.Completion:
        key = repr((prompt, sorted(options.items())))
        if key not in kept:
            submit = plain.submit_chat if isinstance(prompt, list) else plain.submit
            kept[key] = submit(prompt, **options).result()  # type: ignore[arg-type]
        return kept[key]

    return completion


Agrees = Callable[..., None]


@pytest.fixture(scope="module")
def agrees(model: llamactx.LlamaModel, plain: llamactx.Engine, alone: Alone) -> Agrees:
    """Checks a greedy completion with drafts against the same request without (``alone``):
    equal, or parted at a near-tie of the model's candidates (``same_greedy_output``: verifying
    drafts decodes several tokens at once, whose numbers differ a little from one at a time)."""

    def check(with_drafts: llamactx.Completion, prompt: str | list[dict[str, str]], **options: Any) -> None:
        tokens = plain.chat_tokens(prompt) if isinstance(prompt, list) else plain.tokens(prompt)
        same_greedy_output(model, tokens, with_drafts, alone(prompt, **options))

    return check


@pytest.fixture(scope="module")
def speculative(
    model: llamactx.LlamaModel, drafting: llamactx.NgramDraft | llamactx.DraftModel
) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(model, speculative=drafting, **OPTIONS) as engine:
        yield engine


def test_replies_that_part_away_from_a_near_tie_are_told_apart(
    model: llamactx.LlamaModel, plain: llamactx.Engine, alone: Alone
) -> None:
    """The comparison the other tests make lets greedy replies part only where the model's two
    candidates are close: a reply with a token replaced by the one before it (what a drafted
    token kept after its rejection looks like), or ended early, fails it."""
    prompt, reply = plain.tokens(RECORDS), alone(RECORDS, max_tokens=30).tokens
    assert same_greedy_tokens(model, prompt, reply, list(reply))
    for wrong in ([*reply[:12], reply[11], *reply[13:]], reply[:12]):
        with pytest.raises(AssertionError, match="parted at token 12"):
            same_greedy_tokens(model, prompt, wrong, reply)


# The verification of a step's drafts is one for both kinds; the draft model also drafts for
# the requests together, in its own batch (the n-gram lookup reads each request's tokens alone;
# its drafts were verified in this mix too until 2026-12-06).
@pytest.mark.parametrize("drafting", ["draft_model"], indirect=True)
def test_greedy_tokens_of_a_mix_of_requests_are_the_models_choices(
    model: llamactx.LlamaModel, speculative: llamactx.Engine
) -> None:
    """Requests submitted together share decodes, so their numbers differ a little from decoding
    alone, and a greedy token can change where two candidates are close (it did without drafts
    too): each token is checked against the model's choice after the tokens before it, read again
    in one decode, within ``BATCHING_TOLERANCE``. A drafted token kept after its rejection would
    be far from the model's choice (one replaced by the token before it fell 16.9 below)."""
    # With a KV stream per sequence, a step drafts as many tokens for each request, or none: all
    # three draft together until the story ends (40 tokens), then the quote and the records.
    requests = [
        speculative.submit_chat(QUOTE, max_tokens=100),
        speculative.submit_chat(FREE, max_tokens=40),
        speculative.submit(RECORDS, max_tokens=64),
    ]
    drafted = [request.result() for request in requests]
    prompts = [speculative.chat_tokens(QUOTE), speculative.chat_tokens(FREE), speculative.tokens(RECORDS)]
    for prompt, completion in zip(prompts, drafted, strict=True):
        assert worst_greedy_gap(model, prompt, completion.tokens) < BATCHING_TOLERANCE
    # Drafts were accepted and rejected while the requests shared decodes: both paths of the
    # verification ran. (How much drafting saves is the quoting test's; in a mix, a reply that
    # parts from decoding alone quotes less.)
    accepted, proposed = sum(c.accepted_tokens for c in drafted), sum(c.drafted_tokens for c in drafted)
    assert 0 < accepted < proposed


def test_a_reply_quoting_its_input_is_drafted_from_the_place_it_quotes(
    model: llamactx.LlamaModel, alone: Alone, agrees: Agrees
) -> None:
    # The text repeats many 3-token runs ("the", "of the", ", and"): the lookup follows the
    # repeat that reaches furthest back, which is the place in the prompt being quoted, so
    # nearly every draft is accepted whole and most tokens need no decode of their own.
    without = alone(QUOTE, max_tokens=300)
    assert without.text.strip() == QUOTED_TEXTS[0]
    with llamactx.Engine(model, speculative=llamactx.NgramDraft(only_where_faster=False), **OPTIONS) as engine:
        quoted = engine.submit_chat(QUOTE, max_tokens=300).result()
    agrees(quoted, QUOTE, max_tokens=300)
    assert quoted.accepted_tokens >= 0.85 * quoted.completion_tokens
    assert quoted.accepted_tokens >= 0.9 * quoted.drafted_tokens


# The reply's end is the verification's, which both kinds of draft share: the n-gram lookup drafts
# the records' repeats far ahead, so ends fall inside its drafts most often.
@pytest.mark.parametrize("drafting", ["ngram"], indirect=True)
def test_stop_strings_and_max_tokens_end_the_reply_inside_a_draft(agrees: Agrees, speculative: llamactx.Engine) -> None:
    for max_tokens in (1, 2, 5, 23, 64):
        agrees(speculative.submit(RECORDS, max_tokens=max_tokens).result(), RECORDS, max_tokens=max_tokens)
    # Stop strings the reply reaches (its greedy text: " Charlie\nAge: 28\nCity: New York\n\nName:
    # David\nAge: 42\nCity: Sydney..."), within a token and across tokens.
    for stop in ("City: New", "\n\nName: D", ["Sydney", "Age: 4"]):
        with_drafts = speculative.submit(RECORDS, max_tokens=100, stop=stop).result()
        agrees(with_drafts, RECORDS, max_tokens=100, stop=stop)
        assert with_drafts.finish_reason == "stop"
    counted = speculative.submit(RECORDS, max_tokens=23).result()
    assert counted.completion_tokens == 23
    assert counted.accepted_tokens > 0


def test_json_schema_and_grammar_constraints_hold_across_drafts(agrees: Agrees, speculative: llamactx.Engine) -> None:
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
    agrees(with_drafts, prompt, max_tokens=200, json_schema=schema)
    assert with_drafts.drafted_tokens > 0
    grammar = 'root ::= ("ab" | "abc")+ "."'
    with_drafts = speculative.submit("Letters:", max_tokens=40, grammar=grammar).result()
    agrees(with_drafts, "Letters:", max_tokens=40, grammar=grammar)
    assert set(with_drafts.text) <= set("abc.")


def test_log_probabilities_are_those_of_decoding_without_drafts(
    alone: Alone, agrees: Agrees, speculative: llamactx.Engine
) -> None:
    with_drafts = speculative.submit(RECORDS, max_tokens=40, logprobs=3).result()
    without = alone(RECORDS, max_tokens=40, logprobs=3)
    agrees(with_drafts, RECORDS, max_tokens=40, logprobs=3)
    assert with_drafts.accepted_tokens > 0
    # The rows while the tokens agree (all of them, unless they parted at a near-tie).
    rows = zip(with_drafts.tokens, without.tokens, with_drafts.logprobs, without.logprobs, strict=False)
    for drafted_token, plain_token, drafted_row, plain_row in rows:
        if drafted_token != plain_token:
            break
        assert [token for token, _ in drafted_row] == [token for token, _ in plain_row]
        np.testing.assert_allclose([p for _, p in drafted_row], [p for _, p in plain_row], atol=1e-4)


# The draw is the verification's, which both kinds of draft share: the draft model proposes
# tokens in sampled text, where the n-gram lookup finds fewer repeats to draft from.
@pytest.mark.parametrize("drafting", ["draft_model"], indirect=True)
def test_seeded_sampling_draws_what_decoding_without_drafts_draws(alone: Alone, speculative: llamactx.Engine) -> None:
    """Every token is still drawn by the request's own sampler, once, from the same output:
    with a seed, each draw equals the draw without drafts, so the distribution of outputs is
    the model's (the point-mass case of the rejection rule: a drafted token is kept exactly when
    it is the token drawn). Six seeds (twelve until 2026-12-06): 72 draws, drafts accepted and
    rejected among them; the distribution test draws 900 continuations."""
    accepted = drafted = 0
    outputs = set()
    for seed in range(6):
        sampling = llamactx.SamplingParams(temperature=1.0, seed=seed)
        with_drafts = speculative.submit(RECORDS, max_tokens=12, sampling=sampling).result()
        same_output(with_drafts, alone(RECORDS, max_tokens=12, sampling=sampling))
        accepted += with_drafts.accepted_tokens
        drafted += with_drafts.drafted_tokens
        outputs.add(with_drafts.text)
    assert 0 < accepted < drafted
    assert len(outputs) > 1, "the draws differ between seeds"


def test_a_cancelled_request_leaves_no_drafted_cells_behind(
    model: llamactx.LlamaModel, alone: Alone, agrees: Agrees, speculative: llamactx.Engine
) -> None:
    request = speculative.submit_chat(GROUNDED, max_tokens=240)
    pieces = iter(request)
    first = next(pieces)
    request.cancel()
    cancelled = request.result()
    assert cancelled.finish_reason == "cancelled"
    # The same request without drafts, as far as the cancelled one went.
    full = alone(GROUNDED, max_tokens=len(cancelled.tokens))
    assert first
    if same_greedy_tokens(model, speculative.chat_tokens(GROUNDED), cancelled.tokens, full.tokens):
        assert full.text == cancelled.text
    # The next request in the freed sequence decodes as on a clean one.
    agrees(speculative.submit(RECORDS, max_tokens=30).result(), RECORDS, max_tokens=30)
    assert speculative.stats().kv_cells_used == 0


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
        same_greedy_output(model, prompt, drafted, without.submit(prompt, max_tokens=100).result())
    assert drafted.finish_reason == "length"
    assert len(prompt) + drafted.completion_tokens == options["n_ctx"]
    assert drafted.accepted_tokens > 0


def conversation(engine: llamactx.Engine) -> list[llamactx.Completion]:
    """Two turns of a chat: the second reuses the first's cells."""
    first = engine.submit_chat(GROUNDED, max_tokens=100).result()
    return [first, engine.submit_chat(second_turn(first), max_tokens=60).result()]


def second_turn(first: llamactx.Completion) -> list[dict[str, str]]:
    return [*GROUNDED, {"role": "assistant", "content": first.text}, {"role": "user", "content": "Again."}]


CACHED: dict[str, Any] = {"n_ctx": 4096, "n_seq_max": 4}


@pytest.fixture(scope="module")
def cached_conversation(model: llamactx.LlamaModel) -> tuple[list[llamactx.Completion], list[list[int]]]:
    """``conversation`` on an engine with the prefix cache and no drafts, and its two prompts:
    computed once for both kinds of draft (greedy, so a new run would give the same)."""
    with llamactx.Engine(model, **CACHED) as cached:
        alone = conversation(cached)
        return alone, [cached.chat_tokens(GROUNDED), cached.chat_tokens(second_turn(alone[0]))]


# Which cells a verification keeps (accepted drafts) and removes (rejected ones) is one for both
# kinds; the draft model also keeps cells of its own, which a reused prefix must find in step
# (the n-gram lookup was checked here too until 2026-12-06).
@pytest.mark.parametrize("drafting", ["draft_model"], indirect=True)
def test_the_prefix_cache_reuses_cells_of_verified_drafts(
    model: llamactx.LlamaModel,
    drafting: llamactx.NgramDraft | llamactx.DraftModel,
    cached_conversation: tuple[list[llamactx.Completion], list[list[int]]],
) -> None:
    # Reused cells were computed in other chunks than a fresh read's, so the comparison is
    # with the same conversation on an engine with the prefix cache and no drafts.
    with llamactx.Engine(model, speculative=drafting, **CACHED) as cached:
        drafted = conversation(cached)
        stats = cached.stats()
    alone, prompts = cached_conversation
    assert drafted[1].cached_tokens > 0
    # Turn by turn, until the replies part (the second turn's prompt holds the first reply).
    if same_greedy_tokens(model, prompts[0], drafted[0].tokens, alone[0].tokens):
        same_output(drafted[0], alone[0])
        assert drafted[1].cached_tokens == alone[1].cached_tokens
        same_greedy_output(model, prompts[1], drafted[1], alone[1])
    assert stats.drafted_tokens == sum(completion.drafted_tokens for completion in drafted)
    assert stats.accepted_tokens == sum(completion.accepted_tokens for completion in drafted) > 0


def test_speculative_options_are_checked(model: llamactx.LlamaModel, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="size_ngram"):
        llamactx.NgramDraft(size_ngram=0)
    with pytest.raises(ValueError, match="size_mgram"):
        llamactx.NgramDraft(size_ngram=4, size_mgram=2)
    with pytest.raises(ValueError, match="size_mgram"):
        llamactx.NgramDraft(size_mgram=100_000)
    with pytest.raises(TypeError, match="NgramDraft, a DraftModel"):
        llamactx.Engine(model, speculative="ngram")  # type: ignore[arg-type]
    with model.new_context(n_ctx=256) as ctx, pytest.raises(TypeError, match="NgramDraft, a DraftModel"):
        llamactx.generate(ctx, "Hello", max_tokens=2, speculative="ngram")  # type: ignore[arg-type]
    mamba = llamactx.LlamaModel.load_from_file(synthetic.write_tiny_mamba(tmp_path / "mamba.gguf"))
    with pytest.raises(ValueError, match="recurrent"):
        llamactx.Engine(mamba, speculative=llamactx.NgramDraft(), n_ctx=256)


#: The served reply's length: compared whole with the engine's, which needs no length (120 until
#: 2026-12-06); the server drafts from its first steps, where it measures whether drafting pays.
SERVED_TOKENS = 60


@pytest.fixture(scope="module")
def served_without_drafts(model: llamactx.LlamaModel) -> llamactx.Completion:
    """The reply an engine with the server's options gives without drafts, for both kinds."""
    with llamactx.Engine(model, **ENGINE_OPTIONS) as reference:
        return reference.submit_chat(GROUNDED, max_tokens=SERVED_TOKENS).result()


@pytest.mark.parametrize("kind", ["--spec-ngram", "--draft-model"])
def test_the_server_with_speculation_answers_as_without_and_exports_the_counts(
    model_path: Path, draft_model_path: Path, served_without_drafts: llamactx.Completion, kind: str
) -> None:
    expected = served_without_drafts
    options = [kind] if kind == "--spec-ngram" else [kind, str(draft_model_path)]
    with (
        running_server(model_path, "--no-prefix-cache", *options) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused") as client,
    ):
        reply = client.chat.completions.create(
            model=MODEL_ID,
            messages=GROUNDED,
            max_tokens=SERVED_TOKENS,
            temperature=0,  # type: ignore[arg-type]
        )
        metrics = server.metrics()
    assert reply.choices[0].message.content == expected.text
    # The default drafts where it measures faster: at least its first steps draft, to measure.
    assert metrics["llamactx_engine_drafted_tokens_total"] >= metrics["llamactx_engine_accepted_tokens_total"]
    assert metrics["llamactx_engine_drafted_tokens_total"] > 0
