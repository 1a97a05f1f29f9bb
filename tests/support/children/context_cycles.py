"""Makes, uses and closes 500 contexts and prints the growth of the resident memory (see
test_leaks.py). Each decodes one token: a context's KV cache and compute buffers are sized when
it is made, not by the batch (five tokens took 48 ms a cycle, one 19 ms)."""

from __future__ import annotations

import os

import harness

import llamactx


def resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cycle(model: llamactx.LlamaModel, tokens: list[int]) -> None:
    ctx = model.new_context(n_ctx=256, n_threads=1)
    batch = llamactx.LlamaBatch(len(tokens))
    batch.add_sequence(tokens, 0, False)
    ctx.decode(batch)
    ctx.get_logits()
    ctx.close()


def growth_over_500_cycles(model: llamactx.LlamaModel) -> None:
    tokens = model.str_to_token("Paris", False)
    for _ in range(50):  # allocator pools and caches reach their size first
        cycle(model, tokens)
    before = resident_mb()
    for _ in range(500):
        cycle(model, tokens)
    print("GROWTH", resident_mb() - before)


if __name__ == "__main__":
    harness.run(growth_over_500_cycles)
