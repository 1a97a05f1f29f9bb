"""Compute threads: contexts without a ThreadPool share one persistent ggml pool per thread
count, and pools survive os.fork(). Each case runs in a fresh interpreter, which starts with
no shared pool and can fork safely."""

from __future__ import annotations

from pathlib import Path

from conftest import run_isolated

ONE_TOKEN = """
import os
import numpy  # first, so that the threads its BLAS starts are counted in the base
batch = llamactx.LlamaBatch(1)
batch.add(model.token_bos(), 0, [0], True)

def decoded(ctx):
    ctx.clear_kv_cache()
    ctx.decode(batch)
    return ctx.get_logits_ith(-1)

def threads():
    return len(os.listdir("/proc/self/task"))
"""


def test_contexts_share_one_persistent_pool_per_thread_count(model_path: Path) -> None:
    code = (
        ONE_TOKEN
        + """
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
"""
    )
    result = run_isolated(model_path, code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("EXTRA ", 1)[1].split() == ["0", "1", "1"]


def test_results_do_not_depend_on_which_pool_computes(model_path: Path) -> None:
    # Batch pools of 3, 4 and 5 threads fill the shared pools (one is for 1 thread); the
    # context asking for a fifth thread count computes without one, as ggml does by default.
    # Single-token decodes run on the 1-thread pool or none, so no core is oversubscribed.
    code = (
        ONE_TOKEN
        + """
import numpy as np
reference = decoded(model.new_context(n_ctx=256, n_threads=1, n_threads_batch=1))
for n_batch_threads in (3, 4, 5, 6):
    ctx = model.new_context(n_ctx=256, n_threads=1, n_threads_batch=n_batch_threads)
    assert np.array_equal(decoded(ctx), reference), n_batch_threads
    before = threads()
    decoded(ctx)
    assert threads() == before
print("OK")
"""
    )
    result = run_isolated(model_path, code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "OK"


def test_a_forked_child_computes_with_fresh_threads(model_path: Path) -> None:
    # A pool's memory is copied by fork() but its threads are not: handing the child's work to
    # it would wait forever, freeing it would join threads that do not exist.
    code = (
        ONE_TOKEN
        + """
import signal
import numpy as np
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
        status = 0
    finally:
        os._exit(status)
_, status = os.waitpid(pid, 0)
print("PARENT", os.waitstatus_to_exitcode(status), np.array_equal(decoded(shared), expected),
      np.array_equal(decoded(attached), expected))
"""
    )
    result = run_isolated(model_path, code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "CHILD True yes yes True True" in result.stdout, result.stdout + result.stderr[-2000:]
    assert "PARENT 0 True True" in result.stdout, result.stdout + result.stderr[-2000:]
