"""Threads: contexts sharing one model, and threads sharing one context, give the results of a
single-threaded run (each sequence lives in its own KV stream, so its state is exact)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

import llamactx

STEPS = 50
PROMPTS = [f"Thread {n} counts: one, two, three, four, five, six, seven, eight, nine, ten." for n in range(8)]


def tokens_for(model: llamactx.LlamaModel, n: int) -> list[int]:
    tokens = model.str_to_token(PROMPTS[n] * 4, False)
    assert len(tokens) >= STEPS
    return tokens[:STEPS]


def decode_one_by_one(ctx: llamactx.LlamaContext, tokens: list[int], seq: int) -> None:
    batch = llamactx.LlamaBatch(1)
    for pos, token in enumerate(tokens):
        batch.clear()
        batch.add(token, pos, [seq], True)
        ctx.decode(batch)


def reference_state(model: llamactx.LlamaModel, tokens: list[int], n_ctx: int, n_seq_max: int, seq: int) -> bytes:
    """The state of ``seq`` after decoding ``tokens`` alone, in a context of the same shape."""
    with model.new_context(n_ctx=n_ctx, n_seq_max=n_seq_max, n_threads=1) as ctx:
        decode_one_by_one(ctx, tokens, seq)
        return ctx.state_seq_get_data(seq)


def run_threads(jobs: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def guarded(job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    assert not errors, errors


def test_eight_threads_on_four_contexts_sharing_one_model(model: llamactx.LlamaModel) -> None:
    contexts = [model.new_context(n_ctx=512, n_seq_max=2, n_threads=1) for _ in range(4)]
    work = [(contexts[n % 4], n // 4, tokens_for(model, n)) for n in range(8)]
    run_threads([lambda c=c, s=s, t=t: decode_one_by_one(c, t, s) for c, s, t in work])
    for n, (ctx, seq, tokens) in enumerate(work):
        assert ctx.state_seq_get_data(seq) == reference_state(model, tokens, 512, 2, seq), f"thread {n}"
    for ctx in contexts:
        ctx.close()


def test_four_threads_hammering_one_context(model: llamactx.LlamaModel) -> None:
    ctx = model.new_context(n_ctx=1024, n_seq_max=4, n_threads=1)
    work = [(seq, tokens_for(model, seq)) for seq in range(4)]

    def hammer(seq: int, tokens: list[int]) -> None:
        decode_one_by_one(ctx, tokens, seq)
        assert ctx.kv_cache_seq_pos_max(seq) == STEPS - 1
        assert model.detokenize(model.str_to_token(PROMPTS[seq], False)) == PROMPTS[seq]

    run_threads([lambda s=s, t=t: hammer(s, t) for s, t in work])
    for seq, tokens in work:
        assert ctx.state_seq_get_data(seq) == reference_state(model, tokens, 1024, 4, seq), f"sequence {seq}"
    ctx.close()


@pytest.mark.whole_machine
def test_contexts_with_two_threads_decoding_at_once(model: llamactx.LlamaModel) -> None:
    # Both want 2 CPUs at the same moments: on a machine without 4, one waits for the other's
    # decode (before, both spun at once, and a token took seconds). Neither result may suffer.
    contexts = [model.new_context(n_ctx=256, n_threads=2, n_threads_batch=2) for _ in range(2)]
    work = [(contexts[n], tokens_for(model, n)[:20]) for n in range(2)]
    run_threads([lambda c=c, t=t: decode_one_by_one(c, t, 0) for c, t in work])
    for n, (ctx, tokens) in enumerate(work):
        assert ctx.state_seq_get_data(0) == reference_state(model, tokens, 256, 1, 0), f"context {n}"
        ctx.close()


def test_a_decode_waiting_for_cpus_stops_when_its_abort_callback_asks(model: llamactx.LlamaModel) -> None:
    cpus = len(os.sched_getaffinity(0))
    holder = model.new_context(n_ctx=256, n_threads=cpus, n_threads_batch=cpus)
    waiter = model.new_context(n_ctx=256, n_threads=1, n_threads_batch=1)
    inside, release = threading.Event(), threading.Event()

    def hold_the_cpus() -> bool:  # runs inside the holder's decode, which has every CPU
        inside.set()
        release.wait(60)
        return False

    holder.set_abort_callback(hold_the_cpus)
    holding = threading.Thread(target=decode_one_by_one, args=(holder, tokens_for(model, 0)[:1], 0))
    holding.start()
    assert inside.wait(60)
    polls = 0

    def fortieth_poll_aborts() -> bool:
        nonlocal polls
        polls += 1
        return polls == 40

    waiter.set_abort_callback(fortieth_poll_aborts)
    try:
        # A decode that ran would poll once at its first node and finish long before 40 polls
        # 5 ms apart: only a decode waiting for a CPU gets to the 40th (0.2 s).
        with pytest.raises(llamactx.DecodeAborted):
            decode_one_by_one(waiter, tokens_for(model, 1)[:1], 0)
        assert waiter.kv_cache_seq_pos_max(0) == -1
    finally:
        release.set()
        holding.join(60)
    assert holder.kv_cache_seq_pos_max(0) == 0
    waiter.set_abort_callback(None)
    decode_one_by_one(waiter, tokens_for(model, 1)[:1], 0)
    assert waiter.kv_cache_seq_pos_max(0) == 0
    holder.close()
    waiter.close()
