"""Batched generation of 8 sequences (PP 32, TG 32 each): llamactx's low-level API and
``generate_batch`` against ``llama-batched-bench`` built from the same llama.cpp source, plus
sequential ``generate`` calls and llama-batched-bench's own 1-sequence run, in one process run.

    python benches/batched.py --batched-bench PATH/TO/llama-batched-bench [--threads 2] [--rounds 3]

Prints a JSON object of aggregate tokens/s (medians of the rounds) and their ratios.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import time

import llamactx

PP, TG, SEQUENCES = 32, 32, 8


def batched_bench(binary: str, model: str, threads: int, n_parallel: int) -> float:
    """Aggregate tokens/s (S column) that llama-batched-bench reports for ``n_parallel``."""
    command = [binary, "-m", model, "-c", "2048", "-b", "2048", "-ub", "512", "-t", str(threads)]
    command += ["-npp", str(PP), "-ntg", str(TG), "-npl", str(n_parallel), "-fa", "auto"]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rows = [line for line in output.splitlines() if re.match(r"\|\s+\d+\s+\|", line)]
    return float(rows[-1].strip("|").split("|")[-1])


def prompts(model: llamactx.LlamaModel) -> list[list[int]]:
    words = model.str_to_token(" one two three four five six seven eight nine ten" * 8, False)
    return [[model.token_bos(), *words[n : n + PP - 1]] for n in range(SEQUENCES)]


def no_eog_sampler(model: llamactx.LlamaModel) -> llamactx.LlamaSampler:
    """Greedy, with end-of-generation tokens banned so every sequence makes TG tokens."""
    banned = [(t, -1e9) for t in range(model.n_vocab()) if model.is_eog_token(t)]
    return llamactx.LlamaSampler.chain(
        [llamactx.LlamaSampler.logit_bias(model.n_vocab(), banned), llamactx.LlamaSampler.greedy()]
    )


def low_level(ctx: llamactx.LlamaContext, token_lists: list[list[int]]) -> float:
    ctx.clear_kv_cache()
    started = time.perf_counter()
    batch = llamactx.LlamaBatch(PP * SEQUENCES, 1)
    for seq, tokens in enumerate(token_lists):
        for pos, token in enumerate(tokens):
            batch.add(token, pos, [seq], pos == PP - 1)
    ctx.decode(batch)
    step = llamactx.LlamaBatch(SEQUENCES, 1)
    for pos in range(PP, PP + TG):
        ctx.get_logits_ith(-1)
        step.clear()
        for seq in range(SEQUENCES):
            step.add(token_lists[seq][pos % PP], pos, [seq], True)
        ctx.decode(step)
    ctx.get_logits_ith(-1)
    return SEQUENCES * (PP + TG) / (time.perf_counter() - started)


def high_level(ctx: llamactx.LlamaContext, token_lists: list[list[int]], sampler: llamactx.LlamaSampler) -> float:
    started = time.perf_counter()
    llamactx.generate_batch(ctx, token_lists, max_tokens=TG, sampler=sampler)
    return SEQUENCES * (PP + TG) / (time.perf_counter() - started)


def sequential(ctx: llamactx.LlamaContext, token_lists: list[list[int]], sampler: llamactx.LlamaSampler) -> float:
    started = time.perf_counter()
    for tokens in token_lists:
        llamactx.generate(ctx, tokens, max_tokens=TG, sampler=sampler)
    return SEQUENCES * (PP + TG) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batched-bench", required=True)
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    path = str(arguments.model or llamactx.default_model_path())
    model = llamactx.LlamaModel.load_from_file(path)
    ctx = model.new_context(
        n_ctx=2048,
        n_batch=2048,
        n_ubatch=512,
        n_seq_max=SEQUENCES,
        n_threads=arguments.threads,
        n_threads_batch=arguments.threads,
    )
    token_lists = prompts(model)
    sampler = no_eog_sampler(model)
    runs: dict[str, list[float]] = {
        k: [] for k in ("bench_8", "bench_1", "low_level_8", "generate_batch_8", "generate_x8")
    }
    for _ in range(arguments.rounds):  # alternate, so drifting machine load hits all alike
        runs["bench_8"].append(batched_bench(arguments.batched_bench, path, arguments.threads, SEQUENCES))
        runs["low_level_8"].append(low_level(ctx, token_lists))
        runs["generate_batch_8"].append(high_level(ctx, token_lists, sampler))
        runs["bench_1"].append(batched_bench(arguments.batched_bench, path, arguments.threads, 1))
        runs["generate_x8"].append(sequential(ctx, token_lists, sampler))
    medians = {name: statistics.median(values) for name, values in runs.items()}
    ratios = {
        "low_level_8 / bench_8": medians["low_level_8"] / medians["bench_8"],
        "generate_batch_8 / bench_8": medians["generate_batch_8"] / medians["bench_8"],
        "generate_batch_8 / generate_x8": medians["generate_batch_8"] / medians["generate_x8"],
        "bench_8 / bench_1": medians["bench_8"] / medians["bench_1"],
    }
    print(json.dumps({"tokens_per_s": medians, "ratios": ratios, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
