"""Thread counts for tests that ask for more than one: a parallel test worker (``pytest -n``)
keeps to one CPU, and contexts refuse more threads than the CPUs a process may use."""

from __future__ import annotations

import os


def threads(wanted: int = 2) -> int:
    """``wanted`` compute threads, or the CPUs this process may use where they are fewer (the
    results do not depend on the count: ``test_pools.py``)."""
    return min(wanted, len(os.sched_getaffinity(0)))
