"""The thread-pool design, measured: contexts on the shared pool (the default) against the
alternatives it was chosen over, alternating in one run.

- "own pool, poll 0": a ThreadPool per context whose workers sleep at once after a decode,
  so every decode must wake them.
- "two contexts in turn": one-token decodes alternating between two contexts, on the shared
  pool against a polling ThreadPool per context (each context's idle workers then spin while
  the other context computes).

    python benches/pools.py [--threads 2] [--rounds 6]

Prints JSON: medians of tokens/s and each comparison's median of per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from compare import paired_ratio

import llamactx
from llamactx.bench import generation_speed

TG = 128


def in_turn(contexts: list[llamactx.LlamaContext], n_tokens: int, token: int) -> float:
    """Tokens/s of one-token decodes alternating between ``contexts``."""
    batch = llamactx.LlamaBatch(1)
    for ctx in contexts:
        ctx.clear_kv_cache()
    started = time.perf_counter()
    for pos in range(n_tokens // len(contexts)):
        for ctx in contexts:
            batch.clear()
            batch.add(token, pos, [0], True)
            ctx.decode(batch)
            ctx.get_logits_ith(-1)
    return n_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    arguments = parser.parse_args()
    model = llamactx.LlamaModel.load_from_file(arguments.model or llamactx.default_model_path())
    threads = arguments.threads

    def context(pool: llamactx.ThreadPool | None = None) -> llamactx.LlamaContext:
        ctx = model.new_context(n_ctx=256, n_threads=threads, n_threads_batch=threads, flash_attn_type=0)
        if pool is not None:
            ctx.attach_threadpool(pool)
        return ctx

    shared, sleeping = context(), context(llamactx.ThreadPool(threads, poll=0))
    shared_pair = [context(), context()]
    own_pair = [context(llamactx.ThreadPool(threads)), context(llamactx.ThreadPool(threads))]
    token = model.token_bos()
    runs: dict[str, list[float]] = {}
    for round_index in range(arguments.rounds):
        measures = {
            "tg128 shared pool": lambda: generation_speed(shared, TG, token),
            "tg128 own pool, poll 0": lambda: generation_speed(sleeping, TG, token),
            "two contexts in turn, shared pool": lambda: in_turn(shared_pair, TG, token),
            "two contexts in turn, own polling pools": lambda: in_turn(own_pair, TG, token),
        }
        names = list(measures) if round_index % 2 == 0 else list(reversed(measures))
        for name in names:
            time.sleep(0.3)  # the last measure's polling workers go to sleep first
            runs.setdefault(name, []).append(measures[name]())

    def paired(ours: str, theirs: str) -> float:
        return paired_ratio(runs[ours], runs[theirs])

    print(
        json.dumps(
            {
                "threads": threads,
                "medians": {name: statistics.median(values) for name, values in runs.items()},
                "ratios": {
                    "shared / own pool, poll 0": paired("tg128 shared pool", "tg128 own pool, poll 0"),
                    "in turn: shared / own polling pools": paired(
                        "two contexts in turn, shared pool", "two contexts in turn, own polling pools"
                    ),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
