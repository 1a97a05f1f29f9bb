"""State and session save/restore on SmolLM2: restored contexts continue exactly like the
original (llama.cpp's state holds the KV memory but no logits, so the last prompt token is
decoded again after a restore)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.decoding import decode_prompt
from support.prompts import PARIS_PROMPT

import llamactx

GREEDY_STEPS = 8


def greedy_continuation(ctx: llamactx.LlamaContext, tokens: list[int], seq_id: int = 0) -> list[int]:
    """Greedy tokens after ``tokens``, whose KV cells are already in ``seq_id``: the last
    token is removed and decoded again to get logits."""
    n = len(tokens)
    assert ctx.clear_kv_cache_seq(seq_id, n - 1, None)
    batch = llamactx.LlamaBatch(1)
    batch.add(tokens[-1], n - 1, [seq_id], True)
    ctx.decode(batch)
    sampler = llamactx.LlamaSampler.greedy()
    out = []
    for pos in range(n, n + GREEDY_STEPS):
        token = sampler.sample(ctx, -1)
        out.append(token)
        batch.clear()
        batch.add(token, pos, [seq_id], True)
        ctx.decode(batch)
    return out


@pytest.fixture
def tokens(model: llamactx.LlamaModel) -> list[int]:
    return model.str_to_token(PARIS_PROMPT + " Paris, and the capital of Italy is", False)


@pytest.fixture
def source(model: llamactx.LlamaModel, tokens: list[int]) -> llamactx.LlamaContext:
    ctx = model.new_context(n_ctx=256, n_seq_max=2)
    decode_prompt(ctx, tokens)
    return ctx


def fresh(model: llamactx.LlamaModel) -> llamactx.LlamaContext:
    return model.new_context(n_ctx=256, n_seq_max=2)


def test_state_bytes_round_trip_gives_identical_logits_and_continuation(
    model: llamactx.LlamaModel, source: llamactx.LlamaContext, tokens: list[int]
) -> None:
    expected_logits = source.get_logits_ith(-1)
    state = source.state_get_data()
    assert isinstance(state, bytes)
    assert len(state) == source.state_get_size() == source.get_state_size()
    target = fresh(model)
    assert target.state_set_data(state) == len(state)
    with pytest.raises(IndexError):
        target.get_logits()  # a restore brings back no logits
    expected = greedy_continuation(source, tokens)
    logits_after_continuation = source.get_logits_ith(-1)
    target.clear_kv_cache_seq(0, len(tokens) - 1, None)
    batch = llamactx.LlamaBatch(1)
    batch.add(tokens[-1], len(tokens) - 1, [0], True)
    target.decode(batch)
    np.testing.assert_array_equal(target.get_logits_ith(-1), expected_logits)
    target.state_set_data(state)
    assert greedy_continuation(target, tokens) == expected
    np.testing.assert_array_equal(target.get_logits_ith(-1), logits_after_continuation)


def test_copy_and_set_state_data_are_the_safe_old_names(
    model: llamactx.LlamaModel, source: llamactx.LlamaContext, tokens: list[int]
) -> None:
    state = source.copy_state_data()
    assert state == source.state_get_data()
    target = fresh(model)
    assert target.set_state_data(bytearray(state)) == len(state)
    assert greedy_continuation(target, tokens) == greedy_continuation(source, tokens)


def test_state_file_round_trip(
    model: llamactx.LlamaModel, source: llamactx.LlamaContext, tokens: list[int], tmp_path: Path
) -> None:
    path = tmp_path / "state.bin"
    assert source.state_save_file(path, tokens) is True
    target = fresh(model)
    assert target.state_load_file(str(path), len(tokens)) == tokens
    assert greedy_continuation(target, tokens) == greedy_continuation(source, tokens)
    with pytest.raises(llamactx.StateError):
        fresh(model).state_load_file(path, len(tokens) - 1)  # capacity too small


def test_session_file_round_trip(
    model: llamactx.LlamaModel, source: llamactx.LlamaContext, tokens: list[int], tmp_path: Path
) -> None:
    path = tmp_path / "session.bin"
    source.save_session_file(path, np.array(tokens, dtype=np.int32))
    target = fresh(model)
    assert target.load_session_file(path, 256) == tokens
    assert greedy_continuation(target, tokens) == greedy_continuation(source, tokens)


def test_sequence_state_moves_between_sequences(
    model: llamactx.LlamaModel, source: llamactx.LlamaContext, tokens: list[int]
) -> None:
    data = source.state_seq_get_data(0)
    assert len(data) == source.state_seq_get_size(0)
    target = fresh(model)
    assert target.state_seq_set_data(data, 1) == len(data)
    assert target.kv_cache_seq_pos_max(1) == len(tokens) - 1
    assert target.kv_cache_seq_pos_max(0) == -1
    assert greedy_continuation(target, tokens, seq_id=1) == greedy_continuation(source, tokens)


def test_sequence_state_ext_flags(model: llamactx.LlamaModel, source: llamactx.LlamaContext) -> None:
    full = source.state_seq_get_data_ext(0, 0)
    assert full == source.state_seq_get_data(0)
    assert source.state_seq_get_size_ext(0, 0) == len(full)
    target = fresh(model)
    assert target.state_seq_set_data_ext(full, 0, 0) == len(full)
    # SmolLM2 has no sliding-window or recurrent cache: the partial state holds no cells.
    assert source.state_seq_get_size_ext(0, 1) < len(full)
    with pytest.raises(ValueError, match="flags"):
        source.state_seq_get_data_ext(0, 2)  # ON_DEVICE: refers to buffers llama.cpp frees


def test_sequence_state_file_round_trip(
    model: llamactx.LlamaModel, source: llamactx.LlamaContext, tokens: list[int], tmp_path: Path
) -> None:
    path = tmp_path / "seq.bin"
    written = source.state_seq_save_file(path, 0, tokens)
    assert written > 0
    target = fresh(model)
    assert target.state_seq_load_file(path, 1, len(tokens)) == tokens
    assert greedy_continuation(target, tokens, seq_id=1) == greedy_continuation(source, tokens)


def test_corrupt_state_raises(model: llamactx.LlamaModel, source: llamactx.LlamaContext, tmp_path: Path) -> None:
    state = source.state_get_data()
    target = fresh(model)
    with pytest.raises(llamactx.StateError):
        target.state_set_data(state[: len(state) // 2])
    with pytest.raises(llamactx.StateError):
        target.state_seq_set_data(b"\x00" * 64, 0)
    with pytest.raises(TypeError):
        target.state_set_data(12)  # type: ignore[arg-type]
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"junk" * 100)
    with pytest.raises(llamactx.LoadSessionError) as raised:
        target.load_session_file(junk, 16)
    assert raised.value.kind == "FailedToLoad"
    with pytest.raises(llamactx.StateError):
        target.state_load_file(junk, 16)
    with pytest.raises(FileNotFoundError):
        target.state_load_file(tmp_path / "missing.bin", 16)
    with pytest.raises(FileNotFoundError):
        source.state_save_file(tmp_path / "no" / "dir.bin", [1])


def test_empty_sequence_state_is_a_header_only(
    model: llamactx.LlamaModel, source: llamactx.LlamaContext, tokens: list[int]
) -> None:
    ctx = fresh(model)
    empty = ctx.state_seq_get_data(1)
    assert len(empty) == ctx.state_seq_get_size(1) < 64
    other = fresh(model)
    assert other.state_seq_set_data(empty, 0) == len(empty)
    assert other.kv_cache_seq_pos_max(0) == -1
    assert len(source.state_seq_get_data(0)) > 100 * len(empty)
    with pytest.raises(ValueError, match="out of range"):
        ctx.state_seq_get_size(2)
