"""The tg128 protocol that benches/compare.py runs in one child process per library, so
llamactx and llama-cpp-python are measured alike: each child loads the model itself, measures
five times and reports the median. Standard library only: the peer's interpreter imports it.

- "matched": 128 one-token decodes, each output read, on a context with llama-bench's settings
  (n_ctx 640, n_batch 2048, n_ubatch 512, flash attention off, the threads asked for).
- "defaults": 128 greedy tokens through the library's high-level generator on a model and
  context made with no arguments, as a user gets them, timed from the first token.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable

TG = 128
PROMPT = "The capital of France is"
MATCHED = {"n_ctx": 640, "n_batch": 2048, "n_ubatch": 512}


RUNS = 5


def median_of_runs(measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(RUNS))


def generation_rate(tokens: Iterable[object]) -> float:
    """Tokens/s of the first ``TG`` items after the first one of a generator."""
    started = 0.0
    for count, _token in enumerate(tokens):
        if count == 0:
            started = time.perf_counter()  # after the prompt, like a tg figure
        elif count == TG:
            return TG / (time.perf_counter() - started)
    raise RuntimeError(f"generation ended after {count} tokens, before {TG}")


def report(version: str, matched: float, defaults: float) -> None:
    print(json.dumps({"version": version, "matched": matched, "defaults": defaults}))
