"""A decode is all or nothing: aborted, interrupted or refused, it leaves the KV cache exactly as
it found it, whichever micro-batch it stopped in; positions llama.cpp would refuse raise
``ValueError`` naming them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support import background
from support.decoding import decode_prompt

import llamactx

CHILD = Path(__file__).parents[1] / "support" / "children" / "abort_in_ubatch.py"


#: How the decode is stopped, and in which of its three micro-batches.
CASES = [(how, ubatch) for how in ("callback", "sigint") for ubatch in (0, 1, 2)]
UBATCH_NAMES = ("first", "middle", "last")


#: Each case's child, a background job (``support/background.py``): a child spends most of its
#: time in the abort callback's sleeps (over 5 ms after each of about 2,000 graph nodes), not
#: computing. The child finds the default model itself (an empty path).
ABORTS = {
    (how, ubatch): background.Job(f"abort-{how}-{ubatch}", (sys.executable, str(CHILD), "", how, str(ubatch)), 240)
    for how, ubatch in CASES
}
pytestmark = pytest.mark.background(*ABORTS.values())


@pytest.fixture(scope="module")
def aborted() -> dict[tuple[str, int], background.Ended]:
    return {case: background.ended(job) for case, job in ABORTS.items()}


@pytest.mark.parametrize(("how", "ubatch"), CASES, ids=[f"{UBATCH_NAMES[ubatch]}-{how}" for how, ubatch in CASES])
def test_an_abort_in_any_micro_batch_leaves_the_cache_as_it_was(
    aborted: dict[tuple[str, int], background.Ended], how: str, ubatch: int
) -> None:
    result = aborted[how, ubatch]
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    nodes = outcome["nodes_per_ubatch"]
    assert nodes > 10
    # The abort landed inside the chosen micro-batch (the earlier ones had finished).
    assert ubatch * nodes < outcome["aborted_at_call"] <= (ubatch + 1) * nodes
    assert outcome["raised"] == ("DecodeAborted" if how == "callback" else "KeyboardInterrupt")
    assert outcome["pos_max"] == 7
    assert outcome["state_unchanged"], "the sequence's cells differ from before the aborted decode"
    assert outcome["logits_equal_fresh"], outcome["max_logit_difference"]


def batch_at(tokens: list[int], positions: list[int], seq_ids: list[list[int]] | None = None) -> llamactx.LlamaBatch:
    batch = llamactx.LlamaBatch(len(tokens), 2)
    for i, (token, pos) in enumerate(zip(tokens, positions, strict=True)):
        batch.add(token, pos, seq_ids[i] if seq_ids else [0], i == len(tokens) - 1)
    return batch


@pytest.fixture
def two_seq_ctx(model: llamactx.LlamaModel) -> llamactx.LlamaContext:
    return model.new_context(n_ctx=512, n_seq_max=2)


def test_a_batch_must_continue_its_sequence(model: llamactx.LlamaModel, two_seq_ctx: llamactx.LlamaContext) -> None:
    tokens = model.str_to_token("one two three four", False)
    decode_prompt(two_seq_ctx, tokens)
    end = len(tokens) - 1
    with pytest.raises(
        ValueError, match=rf"sequence 0 ends at position {end}.*continue it at {end + 1}, not at {end + 2}"
    ):
        two_seq_ctx.decode(batch_at(tokens[:1], [end + 2]))
    with pytest.raises(ValueError, match=rf"continue it at {end + 1}, not at 0"):
        two_seq_ctx.decode(batch_at(tokens[:1], [0]))
    assert two_seq_ctx.kv_cache_seq_pos_max(0) == end
    two_seq_ctx.decode(batch_at(tokens[:1], [end + 1]))
    assert two_seq_ctx.kv_cache_seq_pos_max(0) == end + 1


def test_gaps_and_steps_back_within_a_batch_are_refused(
    model: llamactx.LlamaModel, two_seq_ctx: llamactx.LlamaContext
) -> None:
    tokens = model.str_to_token("one two three", False)[:3]
    with pytest.raises(ValueError, match=r"sequence 0 have gaps: 3 positions between 0 and 3"):
        two_seq_ctx.decode(batch_at(tokens, [0, 1, 3]))
    with pytest.raises(ValueError, match=r"sequence 0 go back from 2 to 1"):
        two_seq_ctx.decode(batch_at(tokens, [0, 2, 1]))
    assert two_seq_ctx.kv_cache_seq_pos_max(0) == -1


def test_sequences_sharing_tokens_must_hold_the_same_positions(model: llamactx.LlamaModel) -> None:
    ctx = model.new_context(n_ctx=512, n_seq_max=2, kv_unified=True)
    tokens = model.str_to_token("one two three", False)[:3]
    decode_prompt(ctx, tokens[:2], seq_id=0)
    with pytest.raises(ValueError, match=r"sequences 0 and 1 share tokens.*0: 0..=1, 1: -1..=-1"):
        ctx.decode(batch_at(tokens[2:], [2], [[0, 1]]))
    ctx.copy_kv_cache_seq(0, 1)
    ctx.decode(batch_at(tokens[2:], [2], [[0, 1]]))
    assert (ctx.kv_cache_seq_pos_max(0), ctx.kv_cache_seq_pos_max(1)) == (2, 2)


def test_sharing_tokens_needs_one_kv_stream(model: llamactx.LlamaModel, two_seq_ctx: llamactx.LlamaContext) -> None:
    token = model.str_to_token("one", False)[0]
    with pytest.raises(ValueError, match=r"belongs to sequences 0 and 1.*kv_unified=True"):
        two_seq_ctx.decode(batch_at([token], [0], [[0, 1]]))


def test_a_refused_decode_says_what_llama_cpp_logged(ctx: llamactx.LlamaContext) -> None:
    """llama.cpp's -1 covers many refusals; the reason is only in its log, and the exception
    carries the error lines logged during the call."""
    with pytest.raises(llamactx.DecodeError) as raised:
        ctx.decode(llamactx.LlamaBatch(1))
    assert raised.value.code == -1
    assert "(llama.cpp: decode: n_tokens == 0" in str(raised.value)
