"""Speculative decoding in ``generate``, ``stream``, ``chat``, ``ChatSession`` and
``continue_sequence`` (the library's generation on a caller's context): with drafts the output
equals decoding without, in fewer decodes, and a stream closed early leaves the cache holding
exactly its history, with either kind of draft."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support import synthetic
from support.prompts import HELPFUL
from support.speculation import GROUNDED, RECORDS, same_greedy_text

import llamactx

# The module takes about 30 s of a parallel worker: started first (with the other long ones),
# so that it does not run alone at the end of the pass.
pytestmark = pytest.mark.long


def decodes(ctx: llamactx.LlamaContext) -> int:
    """One-token decodes since the last reset: drafts make fewer of them."""
    return ctx.timings().n_eval


def chat_prompt(model: llamactx.LlamaModel, messages: Sequence[Any]) -> list[int]:
    """The tokens ``chat`` and ``ChatSession`` decode for ``messages``."""
    with llamactx.Engine(model, n_ctx=256, n_seq_max=1) as engine:
        return engine.chat_tokens(messages)


STOP = "City: New"
SCHEMA = {"type": "array", "items": {"type": "string"}, "minItems": 5, "maxItems": 5}
FRUITS = "Five fruits as a JSON list:"
LENGTHS = (0, 1, 5, 80)
TURNS = (GROUNDED[1]["content"], "Now repeat only its last line.")
#: The chat's and each session turn's length: compared token for token with decoding without
#: drafts, which needs no length (120 and 80 until 2026-12-06).
CHAT_TOKENS = 60
SESSION_TOKENS = 48


def session_turns(
    model: llamactx.LlamaModel, speculative: llamactx.NgramDraft | llamactx.DraftModel | None
) -> list[Any]:
    """The messages of a two-turn ``ChatSession`` generated with ``speculative``."""
    with model.new_context(n_ctx=2048) as ctx:
        session = llamactx.ChatSession(ctx, system=HELPFUL, max_tokens=SESSION_TOKENS)
        for text in TURNS:
            "".join(session.send(text, speculative=speculative))
        return session.messages


@pytest.fixture(scope="module")
def without_drafts(model: llamactx.LlamaModel) -> dict[str, Any]:
    """Every output the test compares with, generated once for both kinds of draft: each length's
    text and one-token decodes, the stopped stream, the JSON list, the chat reply, the session."""
    with model.new_context(n_ctx=2048) as ctx:
        lengths = {}
        for max_tokens in LENGTHS:
            ctx.perf_context_reset()
            lengths[max_tokens] = (llamactx.generate(ctx, RECORDS, max_tokens=max_tokens), decodes(ctx))
        return {
            "lengths": lengths,
            "stopped": llamactx.generate(ctx, RECORDS, max_tokens=80, stop=[STOP]),
            "json": llamactx.generate(ctx, FRUITS, max_tokens=80, json_schema=SCHEMA),
            "chat": llamactx.chat(ctx, GROUNDED, max_tokens=CHAT_TOKENS),
            "session": session_turns(model, None),
        }


# Every path runs on the engine's step loop, whose verification both kinds of draft share: each
# path is checked with one kind, and each kind on several paths (the n-gram lookup where the
# records' repeats give it drafts, the draft model on chats). ``test_speculative.py`` checks
# both kinds on the engine's own requests.
@pytest.mark.parametrize("drafting", ["ngram"], indirect=True)
def test_generate_and_stream_with_drafts_equal_them_without(
    model: llamactx.LlamaModel,
    drafting: llamactx.NgramDraft | llamactx.DraftModel,
    without_drafts: dict[str, Any],
) -> None:
    """Equal replies, or replies that part at a near-tie of the model's candidates (verifying
    drafts decodes several tokens at once, whose numbers differ a little from one at a time:
    ``same_greedy_tokens``), in fewer decodes."""
    records = model.str_to_token(RECORDS, model.add_bos_token())
    with model.new_context(n_ctx=2048) as ctx:
        for max_tokens in LENGTHS:
            without, single = without_drafts["lengths"][max_tokens]
            ctx.perf_context_reset()
            with_drafts = llamactx.generate(ctx, RECORDS, max_tokens=max_tokens, speculative=drafting)
            same_greedy_text(model, records, with_drafts, without)
            if max_tokens == 80:
                assert decodes(ctx) < single
        streamed = "".join(llamactx.stream(ctx, RECORDS, max_tokens=80, stop=[STOP], speculative=drafting))
        same_greedy_text(model, records, streamed, without_drafts["stopped"])
        assert STOP not in streamed


@pytest.mark.parametrize("drafting", ["draft_model"], indirect=True)
def test_constrained_generate_chat_and_sessions_with_drafts_equal_them_without(
    model: llamactx.LlamaModel,
    drafting: llamactx.NgramDraft | llamactx.DraftModel,
    without_drafts: dict[str, Any],
) -> None:
    with model.new_context(n_ctx=2048) as ctx:
        same_greedy_text(
            model,
            model.str_to_token(FRUITS, model.add_bos_token()),
            llamactx.generate(ctx, FRUITS, max_tokens=80, json_schema=SCHEMA, speculative=drafting),
            without_drafts["json"],
        )
        same_greedy_text(
            model,
            chat_prompt(model, GROUNDED),
            llamactx.chat(ctx, GROUNDED, max_tokens=CHAT_TOKENS, speculative=drafting),
            without_drafts["chat"],
        )
    # Turn by turn, until the replies part (a later turn's prompt holds the earlier replies).
    without, with_drafts = without_drafts["session"], session_turns(model, drafting)
    for turn in range(2, len(without), 2):
        prompt = chat_prompt(model, without[:turn])
        if not same_greedy_text(model, prompt, with_drafts[turn][1], without[turn][1]):
            break


def test_a_stream_closed_early_leaves_the_kv_cache_holding_its_history(
    model: llamactx.LlamaModel, drafting: llamactx.NgramDraft | llamactx.DraftModel
) -> None:
    prompt = model.str_to_token(RECORDS, model.add_bos_token())
    with model.new_context(n_ctx=2048) as ctx:
        llamactx.prefill(ctx, prompt, 0)
        for read in range(1, 13):  # closed after each piece in turn: some while drafts wait
            # The prompt's cells are kept from the first read; its last token is read again, for
            # its logits (reading the whole prompt each time took half the test: 14.6 s against
            # 7.0 s for both kinds, alone on a CPU).
            assert ctx.clear_kv_cache_seq(0, len(prompt) - 1, None)
            history = list(prompt)
            llamactx.prefill(ctx, history, 0, start=len(prompt) - 1)
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
