"""KV-cache sequence operations on SmolLM2."""

from __future__ import annotations

import numpy as np
import pytest
from support.decoding import decode_prompt
from support.prompts import PARIS_PROMPT

import llamactx


@pytest.fixture
def two_seq(model: llamactx.LlamaModel) -> llamactx.LlamaContext:
    return model.new_context(n_ctx=512, n_seq_max=2)


def next_logits(ctx: llamactx.LlamaContext, token: int, pos: int, seq: int) -> np.ndarray:
    batch = llamactx.LlamaBatch(1)
    batch.add(token, pos, [seq], True)
    ctx.decode(batch)
    return ctx.get_logits_ith(0)


def test_copied_sequence_continues_like_its_source(
    model: llamactx.LlamaModel, two_seq: llamactx.LlamaContext, paris: int
) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    decode_prompt(two_seq, tokens, seq_id=0)
    two_seq.copy_kv_cache_seq(0, 1)
    assert two_seq.kv_cache_seq_pos_max(1) == len(tokens) - 1
    from_source = next_logits(two_seq, paris, len(tokens), 0)
    from_copy = next_logits(two_seq, paris, len(tokens), 1)
    np.testing.assert_allclose(from_copy, from_source, rtol=1e-5, atol=1e-4)


def test_copy_cache_copies_a_prefix_in_a_unified_cache(model: llamactx.LlamaModel) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    with model.new_context(n_ctx=512, n_seq_max=2, kv_unified=True) as ctx:
        decode_prompt(ctx, tokens, seq_id=0)
        ctx.copy_cache(0, 1, 3)
        assert ctx.kv_cache_seq_pos_max(1) == 2
        assert ctx.memory_seq_pos_min(1) == 0
        ctx.copy_kv_cache_seq(0, 1, 3, 4)
        assert ctx.kv_cache_seq_pos_max(1) == 3


def test_partial_copies_between_kv_streams_are_refused(
    model: llamactx.LlamaModel, two_seq: llamactx.LlamaContext
) -> None:
    decode_prompt(two_seq, model.str_to_token(PARIS_PROMPT, False), seq_id=0)
    with pytest.raises(ValueError, match="kv_unified"):
        two_seq.copy_cache(0, 1, 3)  # llama.cpp would abort: per-sequence streams copy whole buffers
    with pytest.raises(ValueError, match="kv_unified"):
        two_seq.copy_kv_cache_seq(0, 1, 2, None)


def test_kv_cache_seq_add_moves_positions(model: llamactx.LlamaModel, two_seq: llamactx.LlamaContext) -> None:
    assert two_seq.memory_can_shift()
    decode_prompt(two_seq, model.str_to_token(PARIS_PROMPT, False))
    before = two_seq.kv_cache_seq_pos_max(0)
    two_seq.kv_cache_seq_add(0, None, None, 7)
    assert two_seq.kv_cache_seq_pos_max(0) == before + 7
    assert two_seq.memory_seq_pos_min(0) == 7
    two_seq.kv_cache_seq_add(0, 9, None, -2)
    assert two_seq.kv_cache_seq_pos_max(0) == before + 5


def test_kv_cache_seq_div_divides_positions(model: llamactx.LlamaModel, two_seq: llamactx.LlamaContext) -> None:
    decode_prompt(two_seq, model.str_to_token("one two three four five six seven eight", False))
    last = two_seq.kv_cache_seq_pos_max(0)
    two_seq.kv_cache_seq_div(0, None, None, 2)
    assert two_seq.kv_cache_seq_pos_max(0) == last // 2


def test_clear_and_keep(model: llamactx.LlamaModel, two_seq: llamactx.LlamaContext) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    decode_prompt(two_seq, tokens, seq_id=0)
    decode_prompt(two_seq, tokens, seq_id=1)
    assert two_seq.clear_kv_cache_seq(0, 3, None) is True
    assert two_seq.kv_cache_seq_pos_max(0) == 2
    two_seq.llama_kv_cache_seq_keep(1)
    assert two_seq.kv_cache_seq_pos_max(0) == -1
    assert two_seq.kv_cache_seq_pos_max(1) == len(tokens) - 1
    assert two_seq.clear_kv_cache_seq() is True
    assert two_seq.kv_cache_seq_pos_max(1) == -1


def test_position_and_id_errors(two_seq: llamactx.LlamaContext) -> None:
    with pytest.raises(llamactx.KvCacheConversionError) as raised:
        two_seq.copy_kv_cache_seq(0, 1, None, 2**31)
    assert raised.value.kind == "P1TooLarge"
    with pytest.raises(llamactx.KvCacheConversionError) as raised:
        two_seq.kv_cache_seq_pos_max(2**40)
    assert raised.value.kind == "SeqIdTooLarge"
    with pytest.raises(ValueError, match="negative"):
        two_seq.clear_kv_cache_seq(0, -5, None)
    with pytest.raises(ValueError, match="out of range"):
        two_seq.llama_kv_cache_seq_keep(2)
