"""Which ggml threads decodes use (see test_pools.py). A fresh interpreter starts with no
shared pool, and its thread count and forks concern no other test."""

from __future__ import annotations

import os
import signal

import harness
import numpy as np  # before any count: the threads its BLAS starts belong to the base
import numpy.typing as npt

import llamactx


def decoded(ctx: llamactx.LlamaContext) -> npt.NDArray[np.float32]:
    """The logits of one BOS token decoded alone."""
    batch = llamactx.LlamaBatch(1)
    batch.add(ctx.model.token_bos(), 0, [0], True)
    ctx.clear_kv_cache()
    ctx.decode(batch)
    return ctx.get_logits_ith(-1)


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def one_pool_per_thread_count(model: llamactx.LlamaModel) -> None:
    base = threads()
    one = model.new_context(n_ctx=256, n_threads=1, n_threads_batch=1)
    decoded(one)
    after_one = threads()  # a pool of one thread has no worker
    two = model.new_context(n_ctx=256, n_threads=2, n_threads_batch=2)
    decoded(two)
    after_two = threads()  # its worker stays after the decode
    other = model.new_context(n_ctx=256, n_threads=2, n_threads_batch=2)
    decoded(other)
    decoded(two)
    print("EXTRA", after_one - base, after_two - base, threads() - base)


def same_logits_on_every_pool(model: llamactx.LlamaModel) -> None:
    reference = decoded(model.new_context(n_ctx=256, n_threads=1, n_threads_batch=1))
    for n_batch_threads in range(2, len(os.sched_getaffinity(0)) + 1):
        ctx = model.new_context(n_ctx=256, n_threads=1, n_threads_batch=n_batch_threads)
        assert np.array_equal(decoded(ctx), reference), n_batch_threads
        before = threads()
        decoded(ctx)
        assert threads() == before
    print("OK")


def forked_child(model: llamactx.LlamaModel) -> None:
    shared = model.new_context(n_ctx=256, n_threads=2, n_threads_batch=2)
    pool = llamactx.ThreadPool(2)
    attached = model.new_context(n_ctx=256, n_threads=2, n_threads_batch=2)
    attached.attach_threadpool(pool)
    expected = decoded(shared)
    assert np.array_equal(decoded(attached), expected)
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a hang kills the child instead of the test run
        status = 1
        try:
            in_child(model, shared, attached, pool, expected)
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    print(
        "PARENT",
        os.waitstatus_to_exitcode(status),
        np.array_equal(decoded(shared), expected),
        np.array_equal(decoded(attached), expected),
    )


def in_child(
    model: llamactx.LlamaModel,
    shared: llamactx.LlamaContext,
    attached: llamactx.LlamaContext,
    pool: llamactx.ThreadPool,
    expected: npt.NDArray[np.float32],
) -> None:
    """After the fork: the shared pool computes, the inherited pool is refused, a fresh one works."""
    same = np.array_equal(decoded(shared), expected)
    try:
        decoded(attached)
        refused = "no"
    except ValueError as error:
        refused = "yes" if "forked" in str(error) else str(error)
    try:
        model.new_context(n_ctx=256).attach_threadpool(pool)
        refused_attach = "no"
    except ValueError as error:
        refused_attach = "yes" if "forked" in str(error) else str(error)
    attached.detach_threadpool()
    after_detach = np.array_equal(decoded(attached), expected)
    pool.close()
    fresh = llamactx.ThreadPool(2)
    attached.attach_threadpool(fresh)
    with_fresh = np.array_equal(decoded(attached), expected)
    print("CHILD", same, refused, refused_attach, after_detach, with_fresh, flush=True)


if __name__ == "__main__":
    harness.run(one_pool_per_thread_count, same_logits_on_every_pool, forked_child)
