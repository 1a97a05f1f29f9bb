"""LlamaContext basics on SmolLM2: decode, logits, greedy sampling, lifetime."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from support.decoding import decode_prompt
from support.prompts import PARIS_PROMPT

import llamactx


def test_greedy_next_token_after_the_capital_of_france_is_paris(
    model: llamactx.LlamaModel, ctx: llamactx.LlamaContext
) -> None:
    decode_prompt(ctx, model.str_to_token(PARIS_PROMPT, False))
    token = llamactx.LlamaSampler.greedy().sample(ctx, -1)
    assert model.token_to_str(token) == " Paris"
    assert int(np.argmax(ctx.get_logits_ith(-1))) == token


def test_logits_are_owned_float32_copies(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext, paris: int) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    decode_prompt(ctx, tokens)
    logits = ctx.get_logits_ith(len(tokens) - 1)
    assert logits.shape == (model.n_vocab(),)
    assert logits.dtype == np.float32
    assert logits.flags.c_contiguous
    assert logits.flags.writeable
    logits[0] += 1.0  # a private copy: writing to it changes nothing native
    assert ctx.get_logits_ith(-1)[0] == logits[0] - 1.0
    before = logits.copy()
    batch = llamactx.LlamaBatch(1)
    batch.add(paris, len(tokens), [0], True)
    ctx.decode(batch)
    np.testing.assert_array_equal(logits, before)
    assert not np.array_equal(ctx.get_logits_ith(0), before)


def test_get_logits_is_the_first_output_row(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    batch = llamactx.LlamaBatch(len(tokens))
    batch.add_sequence(tokens, 0, True)
    ctx.decode(batch)
    np.testing.assert_array_equal(ctx.get_logits(), ctx.get_logits_ith(0))
    np.testing.assert_array_equal(ctx.get_logits_ith(-1), ctx.get_logits_ith(len(tokens) - 1))
    np.testing.assert_array_equal(ctx.get_logits_ith(-len(tokens)), ctx.get_logits_ith(0))


def test_rows_without_logits_raise_index_error(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext) -> None:
    with pytest.raises(IndexError, match="decode"):
        ctx.get_logits()
    tokens = model.str_to_token(PARIS_PROMPT, False)
    decode_prompt(ctx, tokens)
    for row in (0, len(tokens), 10_000, -2, -(2**31)):
        with pytest.raises(IndexError):
            ctx.get_logits_ith(row)
    with pytest.raises(IndexError):
        llamactx.LlamaSampler.greedy().sample(ctx, 0)


def test_same_prompt_gives_identical_logits_after_clearing(
    model: llamactx.LlamaModel, ctx: llamactx.LlamaContext
) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    decode_prompt(ctx, tokens)
    first = ctx.get_logits_ith(-1)
    ctx.clear_kv_cache()
    assert ctx.kv_cache_seq_pos_max(0) == -1
    decode_prompt(ctx, tokens)
    np.testing.assert_array_equal(ctx.get_logits_ith(-1), first)


def test_context_sizes(model: llamactx.LlamaModel) -> None:
    with model.new_context(n_ctx=300, n_batch=64, n_ubatch=32, n_seq_max=2, n_threads=1) as ctx:
        assert ctx.n_ctx() == 512  # padded to 256 cells per sequence
        assert ctx.n_batch() == 64
        assert ctx.n_ubatch() == 32
        assert ctx.n_seq_max() == 2
        assert ctx.n_threads() == 1
        assert ctx.model is not None


def test_context_outlives_its_python_model(model_path: Path, paris: int) -> None:
    model = llamactx.LlamaModel.load_from_file(model_path)
    tokens = model.str_to_token(PARIS_PROMPT, False)
    ctx = model.new_context(n_ctx=256)
    model.close()
    del model
    gc.collect()
    decode_prompt(ctx, tokens)
    assert llamactx.LlamaSampler.greedy().sample(ctx, -1) == paris
    ctx.close()


def test_closed_context_raises_value_error(model: llamactx.LlamaModel) -> None:
    with model.new_context(n_ctx=256) as ctx:
        assert not ctx.closed
    assert ctx.closed
    with pytest.raises(ValueError, match="LlamaContext is closed"):
        ctx.n_ctx()
    with pytest.raises(ValueError, match="closed"):
        ctx.decode(llamactx.LlamaBatch(1))
    ctx.close()  # closing twice is harmless


def test_decode_releases_the_gil(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext) -> None:
    tokens = model.str_to_token("word " * 200, False)
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        decode_prompt(ctx, tokens)
    finally:
        done.set()
        counter.join()
    assert ticks > 1000, "the counting thread barely ran while decode was busy"


def test_invalid_context_parameters(model: llamactx.LlamaModel) -> None:
    with pytest.raises(ValueError, match="n_batch"):
        model.new_context(n_batch=0)
    with pytest.raises(ValueError, match="pooling_type"):
        model.new_context(pooling_type=7)
    with pytest.raises(ValueError, match="KV cache type"):
        model.new_context(cache_type_k="q3_k")
    with pytest.raises(ValueError, match="n_threads must be"):
        model.new_context(n_threads=0)
    with pytest.raises(ValueError, match=r"n_threads_batch must be in 1\.\.=\d+ \(the CPUs this process may use"):
        model.new_context(n_threads_batch=len(os.sched_getaffinity(0)) + 1)
    with pytest.raises(OverflowError):
        model.new_context(n_ctx=-1)
