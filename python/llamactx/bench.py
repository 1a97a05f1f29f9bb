"""Prompt-processing (pp) and token-generation (tg) speed through the low-level API, measured
the way llama-bench measures them: a batch of ``n`` tokens, or ``n`` one-token decodes."""

from __future__ import annotations

import statistics
import time

from llamactx._llamactx import LlamaBatch, LlamaContext

__all__ = ["generation_speed", "prompt_speed", "speeds"]


def prompt_speed(ctx: LlamaContext, n_tokens: int, token: int) -> float:
    """Tokens/s of one decode of ``n_tokens`` tokens into an empty cache."""
    ctx.clear_kv_cache()
    batch = LlamaBatch(n_tokens)
    for pos in range(n_tokens):
        batch.add(token, pos, [0], pos == n_tokens - 1)
    started = time.perf_counter()
    ctx.decode(batch)
    ctx.get_logits_ith(-1)  # reading an output waits for the computation to finish
    return n_tokens / (time.perf_counter() - started)


def generation_speed(ctx: LlamaContext, n_tokens: int, token: int) -> float:
    """Tokens/s of ``n_tokens`` one-token decodes, each output read."""
    ctx.clear_kv_cache()
    batch = LlamaBatch(1)
    started = time.perf_counter()
    for pos in range(n_tokens):
        batch.clear()
        batch.add(token, pos, [0], True)
        ctx.decode(batch)
        ctx.get_logits_ith(-1)
    return n_tokens / (time.perf_counter() - started)


def speeds(ctx: LlamaContext, *, pp: int = 512, tg: int = 128, repetitions: int = 3) -> dict[str, float]:
    """Median pp and tg tokens/s over ``repetitions`` runs, after a short warm-up."""
    token = ctx.model.token_bos()
    prompt_speed(ctx, min(16, pp), token)
    return {
        f"pp{pp}": statistics.median(prompt_speed(ctx, pp, token) for _ in range(repetitions)),
        f"tg{tg}": statistics.median(generation_speed(ctx, tg, token) for _ in range(repetitions)),
    }
