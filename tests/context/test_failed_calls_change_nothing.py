"""Calls that fail leave things as they were, and calls that used to give quietly wrong results
give the right ones (issue 17, classes 7 and 8): restores are transactions, a chat session
survives a failed turn, stale outputs are forgotten, one stop string is one string, and
llama.cpp's logged reason reaches the exception."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.decoding import decode_prompt
from support.prompts import HELPFUL, PARIS_PROMPT

import llamactx


@pytest.fixture
def decoded(model: llamactx.LlamaModel) -> llamactx.LlamaContext:
    ctx = model.new_context(n_ctx=256)
    decode_prompt(ctx, model.str_to_token(PARIS_PROMPT, True))
    return ctx


def test_a_failed_state_restore_keeps_the_state_before(
    model: llamactx.LlamaModel, decoded: llamactx.LlamaContext, tmp_path: Path
) -> None:
    other = model.new_context(n_ctx=256)
    decode_prompt(other, model.str_to_token("one two three four five six seven eight nine ten", True))
    foreign = other.state_get_data()
    before = decoded.state_get_data()
    with pytest.raises(llamactx.StateError):
        decoded.state_set_data(foreign[: len(foreign) - 100])
    assert decoded.state_get_data() == before
    with pytest.raises(llamactx.StateError):
        decoded.state_seq_set_data(other.state_seq_get_data(0)[:-100], 0)
    assert decoded.state_get_data() == before
    truncated = tmp_path / "truncated.bin"
    other.state_save_file(tmp_path / "whole.bin", [1, 2, 3])
    truncated.write_bytes((tmp_path / "whole.bin").read_bytes()[:-100])
    with pytest.raises(llamactx.StateError):
        decoded.state_load_file(truncated, 16)
    assert decoded.state_get_data() == before


def test_a_refused_restore_says_what_llama_cpp_logged(
    model: llamactx.LlamaModel, decoded: llamactx.LlamaContext
) -> None:
    state = decoded.state_get_data()
    with pytest.raises(llamactx.StateError, match=r"\(llama\.cpp: .+\)"):
        model.new_context(n_ctx=256).state_set_data(state[: len(state) // 2])


def test_a_model_llama_cpp_refuses_says_why(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(llamactx.LlamaModelLoadError, match=r"\(llama\.cpp: .+\)"):
        llamactx.LlamaModel.load_from_file(broken)


def test_outputs_are_forgotten_when_the_samplers_change(decoded: llamactx.LlamaContext) -> None:
    decoded.get_logits_ith(-1)
    decoded.set_sampler(0, llamactx.LlamaSampler.chain([llamactx.LlamaSampler.greedy()]))
    decoded.set_sampler(0, None)
    with pytest.raises(IndexError, match="no output row"):
        decoded.get_logits_ith(-1)


def test_one_stop_string_is_not_a_list_of_characters(ctx: llamactx.LlamaContext) -> None:
    whole = llamactx.generate(ctx, PARIS_PROMPT, max_tokens=24)
    stop = whole.split()[2]
    assert llamactx.generate(ctx, PARIS_PROMPT, max_tokens=24, stop=stop) == whole[: whole.index(stop)]
    assert llamactx.generate(ctx, PARIS_PROMPT, max_tokens=24, stop=stop) == llamactx.generate(
        ctx, PARIS_PROMPT, max_tokens=24, stop=[stop]
    )


def test_a_chat_session_survives_a_failed_turn(ctx: llamactx.LlamaContext) -> None:
    session = llamactx.ChatSession(ctx, system=HELPFUL, max_tokens=16)
    system = ("system", HELPFUL)
    with pytest.raises(ValueError, match=r"the prompt has \d+ tokens; a sequence holds"):
        "".join(session.send("word " * 1000))
    assert session.messages == [system]

    def fail_at_once() -> bool:
        raise RuntimeError("stop")

    ctx.set_abort_callback(fail_at_once)
    with pytest.raises(RuntimeError, match="stop"):
        "".join(session.send("What is the capital of France?"))
    ctx.set_abort_callback(None)
    assert session.messages == [system]
    answer = "".join(session.send("What is the capital of France?"))
    assert "Paris" in answer
    assert session.messages == [system, ("user", "What is the capital of France?"), ("assistant", answer)]


def test_a_chat_turn_read_in_part_is_the_assistant_s_turn(ctx: llamactx.LlamaContext) -> None:
    session = llamactx.ChatSession(ctx, system=HELPFUL, max_tokens=16)
    turn = session.send("What is the capital of France?")
    first = next(turn)
    turn.close()
    assert session.messages == [("system", HELPFUL), ("user", "What is the capital of France?"), ("assistant", first)]
    second = "".join(session.send("And the capital of Italy?"))
    assert "Rome" in second
