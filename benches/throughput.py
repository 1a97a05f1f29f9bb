"""Prompt (pp) and generation (tg) speed through llamactx's low-level API, like llama-bench.

    python benches/throughput.py [--model PATH] [--threads N] [--pp 512] [--tg 128] [--reps 3]

Prints one JSON object: tokens/s for each repetition and their median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import llamactx


def prompt_speed(ctx: llamactx.LlamaContext, n_tokens: int, token: int) -> float:
    ctx.clear_kv_cache()
    batch = llamactx.LlamaBatch(n_tokens)
    for pos in range(n_tokens):
        batch.add(token, pos, [0], pos == n_tokens - 1)
    started = time.perf_counter()
    ctx.decode(batch)
    ctx.get_logits_ith(-1)  # reading an output waits for the computation to finish
    return n_tokens / (time.perf_counter() - started)


def generation_speed(ctx: llamactx.LlamaContext, n_tokens: int, token: int) -> float:
    ctx.clear_kv_cache()
    batch = llamactx.LlamaBatch(1)
    started = time.perf_counter()
    for pos in range(n_tokens):
        batch.clear()
        batch.add(token, pos, [0], True)
        ctx.decode(batch)
        ctx.get_logits_ith(-1)
    return n_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pp", type=int, default=512)
    parser.add_argument("--tg", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--flash-attn", type=int, default=0, help="-1 auto, 0 off (llama-bench's default), 1 on")
    arguments = parser.parse_args()
    model = llamactx.LlamaModel.load_from_file(arguments.model or llamactx.default_model_path())
    ctx = model.new_context(
        n_ctx=arguments.pp + arguments.tg,
        n_batch=arguments.pp,
        n_threads=arguments.threads,
        n_threads_batch=arguments.threads,
        flash_attn_type=arguments.flash_attn,
    )
    token = model.token_bos()
    prompt_speed(ctx, 16, token)  # warm-up
    pp = [prompt_speed(ctx, arguments.pp, token) for _ in range(arguments.reps)]
    tg = [generation_speed(ctx, arguments.tg, token) for _ in range(arguments.reps)]
    result = {
        "settings": vars(arguments),
        f"pp{arguments.pp}": {"runs": pp, "median": statistics.median(pp)},
        f"tg{arguments.tg}": {"runs": tg, "median": statistics.median(tg)},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
