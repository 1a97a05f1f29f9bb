"""Compute threads: contexts without a ThreadPool share one persistent ggml pool per thread
count, and pools survive os.fork(). Each case runs in a fresh interpreter, which starts with
no shared pool and can fork safely."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.processes import run_child

# Pools of up to every CPU's thread.
pytestmark = pytest.mark.whole_machine


def test_contexts_share_one_persistent_pool_per_thread_count(model_path: Path) -> None:
    result = run_child(model_path, "shared_pools", "one_pool_per_thread_count")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("EXTRA ", 1)[1].split() == ["0", "1", "1"]


def test_results_do_not_depend_on_which_pool_computes(model_path: Path) -> None:
    # Batch pools of 3, 4 and 5 threads fill the shared pools (one is for 1 thread); the
    # context asking for a fifth thread count computes without one, as ggml does by default.
    # Single-token decodes run on the 1-thread pool or none, so no core is oversubscribed.
    result = run_child(model_path, "shared_pools", "same_logits_on_every_pool")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "OK"


def test_a_forked_child_computes_with_fresh_threads(model_path: Path) -> None:
    # A pool's memory is copied by fork() but its threads are not: handing the child's work to
    # it would wait forever, freeing it would join threads that do not exist.
    result = run_child(model_path, "shared_pools", "forked_child")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "CHILD True yes yes True True" in result.stdout, result.stdout + result.stderr[-2000:]
    assert "PARENT 0 True True" in result.stdout, result.stdout + result.stderr[-2000:]
