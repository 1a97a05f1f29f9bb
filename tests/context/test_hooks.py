"""Abort callback, thread pools, performance counters, memory breakdown and raw pointers."""

from __future__ import annotations

import time

import numpy as np
import pytest
from support.decoding import decode_prompt
from support.prompts import PARIS_PROMPT

import llamactx


def long_batch(model: llamactx.LlamaModel, n: int = 500) -> llamactx.LlamaBatch:
    tokens = (model.str_to_token("the quick brown fox jumps over the lazy dog " * 60, False))[:n]
    batch = llamactx.LlamaBatch(n)
    batch.add_sequence(tokens, 0, False)
    return batch


def test_abort_callback_stops_a_long_decode(model: llamactx.LlamaModel) -> None:
    with model.new_context(n_ctx=512, n_batch=512) as ctx:
        polls = 0

        def stop_soon() -> bool:
            nonlocal polls
            polls += 1
            return polls >= 2

        ctx.set_abort_callback(stop_soon)
        started = time.perf_counter()
        with pytest.raises(llamactx.DecodeAborted) as raised:
            ctx.decode(long_batch(model))
        aborted_after = time.perf_counter() - started
        assert raised.value.kind == "Aborted"
        assert raised.value.code == 2
        assert polls == 2
        assert ctx.kv_cache_seq_pos_max(0) == -1  # the aborted batch left nothing behind
        ctx.set_abort_callback(None)
        started = time.perf_counter()
        ctx.decode(long_batch(model))
        assert time.perf_counter() - started > 2 * aborted_after
        assert ctx.kv_cache_seq_pos_max(0) == 499


def test_abort_callback_exception_propagates(model: llamactx.LlamaModel) -> None:
    with model.new_context(n_ctx=512, n_batch=512) as ctx:

        def broken() -> bool:
            raise RuntimeError("callback failed")

        ctx.set_abort_callback(broken)
        with pytest.raises(RuntimeError, match="callback failed"):
            ctx.decode(long_batch(model))
        ctx.set_abort_callback(lambda: False)
        ctx.decode(long_batch(model))
        with pytest.raises(TypeError):
            ctx.set_abort_callback(42)  # type: ignore[arg-type]


@pytest.mark.whole_machine  # a pool of two threads
def test_thread_pool_gives_the_same_logits(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    decode_prompt(ctx, tokens)
    expected = ctx.get_logits_ith(-1)
    with llamactx.ThreadPool(2) as pool, llamactx.ThreadPool(1) as batch_pool:
        ctx.attach_threadpool(pool, batch_pool)
        assert pool.attached
        assert batch_pool.attached
        with pytest.raises(ValueError, match="detach"):
            pool.close()
        with model.new_context(n_ctx=256) as other, pytest.raises(ValueError, match="already attached"):
            other.attach_threadpool(pool)
        ctx.clear_kv_cache()
        decode_prompt(ctx, tokens)
        np.testing.assert_allclose(ctx.get_logits_ith(-1), expected, rtol=1e-5, atol=1e-4)
        ctx.detach_threadpool()
        assert not pool.attached
        assert not batch_pool.attached
    with pytest.raises(ValueError, match="n_threads"):
        llamactx.ThreadPool(0)


def test_closing_a_context_releases_its_pool(model: llamactx.LlamaModel) -> None:
    pool = llamactx.ThreadPool(1)
    ctx = model.new_context(n_ctx=256)
    ctx.attach_threadpool(pool)
    ctx.close()
    assert not pool.attached
    pool.close()


def test_timings_count_evaluated_tokens(model: llamactx.LlamaModel) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    with model.new_context(n_ctx=256, no_perf=False) as ctx:
        decode_prompt(ctx, tokens)
        ctx.synchronize()
        timings = ctx.timings()
        assert isinstance(timings, llamactx.PerfContextData)
        assert timings.n_p_eval == len(tokens)
        assert timings.t_p_eval_ms > 0
        batch = llamactx.LlamaBatch(1)
        for pos in range(len(tokens), len(tokens) + 3):
            batch.clear()
            batch.add(tokens[0], pos, [0], True)
            ctx.decode(batch)
            ctx.synchronize()  # llama.cpp counts a decode when it synchronises
        assert ctx.timings().n_eval == 3
        assert ctx.timings().t_eval_ms > 0
        ctx.perf_context_reset()
        reset = ctx.timings()
        assert (reset.t_p_eval_ms, reset.t_eval_ms) == (0.0, 0.0)
        assert reset.n_p_eval <= 1  # llama.cpp reports at least 1 to spare divisions by zero
        ctx.reset_timings()


def test_memory_breakdown(ctx: llamactx.LlamaContext, model: llamactx.LlamaModel) -> None:
    records = ctx.memory_breakdown()
    assert records
    assert {"buft_name", "model", "context", "compute", "total"} <= set(records[0])
    assert sum(r["model"] for r in records) >= model.model_size() * 0.9
    assert all(r["total"] == r["model"] + r["context"] + r["compute"] for r in records)
    ctx.memory_breakdown_print()


def test_raw_pointers(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext) -> None:
    with model.new_context(n_ctx=256) as other:
        assert ctx.get_model_ptr() == other.get_model_ptr() != 0
        assert ctx.as_ptr() != other.as_ptr()
        assert ctx.as_ptr() != 0
