"""``llamactx.Engine`` (continuous batching) in one process run, every figure against a baseline
measured in the same run, alternating round by round so drifting machine load hits both alike:

1. aggregate tokens/s of N requests submitted at once (prompt PP, TG tokens each, end of
   generation banned so none stops early) against ``llama-batched-bench -npp PP -ntg TG -npl N``
   with the same context size and threads; p50/p95 time to first token per N;
2. one request alone through the engine against ``generate`` on a context of the same options;
3. time to first token of questions after a shared, already-seen system prompt, with the
   engine's prefix cache on against off.

    python benches/engine.py [--bin DIR_WITH_LLAMA_BATCHED_BENCH] [--threads 2] [--rounds 3]
                             [--pp 128] [--tg 128] [--out bench-results] [--quick]

Writes engine.json and engine.png into --out. Without llama-batched-bench (no --bin, or not in
it) the other parts still run and the JSON says what was skipped. ``--quick`` is a smoke test
with tiny sizes; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import llamactx


@dataclass(frozen=True)
class Sizes:
    """What one run measures; FULL is the benchmark, QUICK a smoke test of the script."""

    parallel: tuple[int, ...]  # N, requests at once
    pp: int  # prompt tokens of each request
    tg: int  # tokens each request generates
    questions: int  # prefix scenario: requests after the shared system prompt
    system_tokens: int  # prefix scenario: tokens of the shared system prompt
    answer_tokens: int  # prefix scenario: tokens each question generates
    single_pairs: int  # one-request scenario: engine/generate pairs per round (each is short)


FULL = Sizes(parallel=(8, 16, 32), pp=128, tg=128, questions=16, system_tokens=600, answer_tokens=16, single_pairs=3)
QUICK = Sizes(parallel=(2, 4), pp=16, tg=8, questions=4, system_tokens=100, answer_tokens=4, single_pairs=1)

CELLS = 256  # llama.cpp pads each sequence's KV cells to a multiple of this
FLASH_ATTN = int(llamactx.LlamaFlashAttnType.AUTO)  # llama-batched-bench's `-fa auto`, as batched.py
TEXT = (
    " The committee reviewed the quarterly report, noted the rising cost of shipping, and asked"
    " the engineers to explain why the new warehouse software still lost track of pallets at night."
)
QUESTIONS = (
    "What is the refund window?",
    "How do I reset my password?",
    "Can I change my delivery address?",
    "Which payment methods do you accept?",
    "Do you ship abroad?",
    "How long does delivery take?",
    "Where is my order?",
    "Can I cancel a subscription?",
    "How do I contact a human?",
    "Is there a student discount?",
    "What does the warranty cover?",
    "How do I return a damaged item?",
    "Can I pay in instalments?",
    "Why was my card declined?",
    "How do I delete my account?",
    "Do gift cards expire?",
)


# --- inputs -------------------------------------------------------------------------------


def n_ctx_for(n_seq: int, tokens_per_seq: int) -> int:
    """A context whose every sequence holds ``tokens_per_seq`` cells, rounded up the way
    llama.cpp pads them anyway, so the engine and llama-batched-bench get the same cells."""
    return n_seq * CELLS * math.ceil(tokens_per_seq / CELLS)


def context_options(threads: int, n_seq: int, n_ctx: int) -> dict[str, Any]:
    """The ``new_context`` options of every context here: llama-batched-bench's (-b 2048 -ub 512)."""
    return {
        "n_ctx": n_ctx,
        "n_seq_max": n_seq,
        "n_batch": 2048,
        "n_ubatch": 512,
        "n_threads": threads,
        "n_threads_batch": threads,
        "flash_attn_type": FLASH_ATTN,
    }


def random_prompt(model: llamactx.LlamaModel, length: int, seed: int) -> list[int]:
    """BOS and ``length - 1`` tokens drawn from ordinary text: a different prompt per seed, so a
    prefix cache finds nothing to reuse between requests or rounds that should not share."""
    pool = model.str_to_token(TEXT, False)
    return [model.token_bos(), *random.Random(seed).choices(pool, k=length - 1)]


def system_prompt(model: llamactx.LlamaModel, length: int) -> list[int]:
    """BOS and a system prompt of exactly ``length`` tokens (numbered rules, cut at ``length``)."""
    rules = " ".join(f"Rule {n}: answer politely, cite section {n} of the manual, keep it short." for n in range(200))
    tokens = model.str_to_token(f"You are the support assistant of a shop. {rules}", False)
    return [model.token_bos(), *tokens[:length]]


def no_early_stop(model: llamactx.LlamaModel) -> llamactx.SamplingParams:
    """Greedy with every end-of-generation token banned, so each request makes exactly
    ``max_tokens`` tokens, as llama-batched-bench does (it never samples)."""
    banned = {token: float("-inf") for token in range(model.n_vocab()) if model.is_eog_token(token)}
    return llamactx.SamplingParams(temperature=0.0, logit_bias=banned)


def no_early_stop_sampler(model: llamactx.LlamaModel) -> llamactx.LlamaSampler:
    """``no_early_stop`` for ``generate``, which takes a sampler."""
    banned = [(token, -1e9) for token in range(model.n_vocab()) if model.is_eog_token(token)]
    return llamactx.LlamaSampler.chain(
        [llamactx.LlamaSampler.logit_bias(model.n_vocab(), banned), llamactx.LlamaSampler.greedy()]
    )


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between the sorted values."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def paired_ratio(ours: list[float], theirs: list[float]) -> float:
    """Median over rounds of each round's ratio (as compare.py): drift between rounds cancels."""
    return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))


# --- 1. aggregate throughput ----------------------------------------------------------------


def batched_bench(binary: Path, model: str, threads: int, n_ctx: int, sizes: Sizes, n: int) -> float:
    """Aggregate tokens/s (S column) that llama-batched-bench reports for ``n`` sequences."""
    command = [str(binary), "-m", model, "-c", str(n_ctx), "-b", "2048", "-ub", "512", "-t", str(threads)]
    command += ["-npp", str(sizes.pp), "-ntg", str(sizes.tg), "-npl", str(n), "-fa", "auto"]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rows = [line for line in output.splitlines() if re.match(r"\|\s+\d+\s+\|", line)]
    return float(rows[-1].strip("|").split("|")[-1])


def burst(
    engine: llamactx.Engine, prompts: list[list[int]], max_tokens: int, sampling: llamactx.SamplingParams | None
) -> tuple[float, list[llamactx.Completion]]:
    """Submits every prompt at once and waits for all; the wall seconds and the completions."""
    started = time.perf_counter()
    requests = [engine.submit(prompt, max_tokens=max_tokens, sampling=sampling) for prompt in prompts]
    completions = [request.result() for request in requests]
    return time.perf_counter() - started, completions


def engine_throughput(
    model: llamactx.LlamaModel, threads: int, sizes: Sizes, n: int, seed: int
) -> tuple[float, list[float], list[int]]:
    """Aggregate tokens/s of ``n`` requests at once, their times to first token, and the
    completion token counts (each should be TG). A fresh engine and fresh prompts per call,
    so nothing is cached from an earlier round."""
    options = context_options(threads, n, n_ctx_for(n, sizes.pp + sizes.tg))
    prompts = [random_prompt(model, sizes.pp, seed * 1000 + i) for i in range(n)]
    sampling = no_early_stop(model)
    with llamactx.Engine(model, **options) as engine:
        burst(engine, [random_prompt(model, 8, -seed - 1)], 2, sampling)  # warm-up, as llama-batched-bench's
        seconds, completions = burst(engine, prompts, sizes.tg, sampling)
    ttft = [c.first_token_seconds for c in completions if c.first_token_seconds is not None]
    return n * (sizes.pp + sizes.tg) / seconds, ttft, [c.completion_tokens for c in completions]


# --- 2. one request -------------------------------------------------------------------------


def single_pair(
    model: llamactx.LlamaModel, ctx: llamactx.LlamaContext, engine: llamactx.Engine, sizes: Sizes, seed: int
) -> tuple[float, float, bool, int]:
    """Generated tokens/s, over the whole request, of one prompt through ``generate`` and
    through the engine; whether both made the same text (greedy: they must) and the engine's
    completion token count."""
    prompt = random_prompt(model, sizes.pp, seed)
    started = time.perf_counter()
    text = llamactx.generate(ctx, prompt, max_tokens=sizes.tg, sampler=no_early_stop_sampler(model))
    generate_rate = sizes.tg / (time.perf_counter() - started)
    seconds, (completion,) = burst(engine, [prompt], sizes.tg, no_early_stop(model))
    return generate_rate, sizes.tg / seconds, completion.text == text, completion.completion_tokens


# --- 3. prefix reuse ------------------------------------------------------------------------


def prefix_ttft(model: llamactx.LlamaModel, threads: int, sizes: Sizes, cache: bool) -> tuple[float, list[int]]:
    """Median time to first token of the questions, all submitted at once after the system
    prompt alone was served once (so a prefix cache holds it), and their cached token counts.
    ``TypeError`` when this engine has no ``prefix_cache`` option."""
    system = system_prompt(model, sizes.system_tokens)
    questions = [system + model.str_to_token(f"\nUser: {q}\nAssistant:", False) for q in QUESTIONS[: sizes.questions]]
    per_seq = max(len(q) for q in questions) + sizes.answer_tokens
    options = context_options(threads, sizes.questions, n_ctx_for(sizes.questions, per_seq))
    with llamactx.Engine(model, prefix_cache=cache, **options) as engine:
        burst(engine, [system], 1, None)
        _, completions = burst(engine, questions, sizes.answer_tokens, None)
    ttft = [c.first_token_seconds for c in completions if c.first_token_seconds is not None]
    return statistics.median(ttft), [c.cached_tokens for c in completions]


# --- the run --------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the rounds collect: figures per name, TTFTs per N, cached token counts, failed
    checks, and scenarios skipped with the reason."""

    runs: dict[str, list[float]] = field(default_factory=dict)
    ttft: dict[int, list[float]] = field(default_factory=dict)
    cached: dict[str, list[int]] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def record(self, name: str, value: float) -> None:
        self.runs.setdefault(name, []).append(value)


def aggregate_round(
    tally: Tally, model: llamactx.LlamaModel, path: str, binary: Path | None, threads: int, sizes: Sizes, index: int
) -> None:
    """Scenario 1 once for every N: llama-batched-bench, then the engine."""
    for n in sizes.parallel:
        if binary is not None:
            n_ctx = n_ctx_for(n, sizes.pp + sizes.tg)
            tally.record(f"aggregate {n}x llama-batched-bench", batched_bench(binary, path, threads, n_ctx, sizes, n))
        rate, firsts, counts = engine_throughput(model, threads, sizes, n, seed=index * 100 + n)
        tally.record(f"aggregate {n}x engine", rate)
        tally.ttft.setdefault(n, []).extend(firsts)
        if any(count != sizes.tg for count in counts):
            tally.checks.append(f"round {index}, N={n}: completion tokens {sorted(set(counts))}, not {sizes.tg}")


def single_round(
    tally: Tally,
    model: llamactx.LlamaModel,
    ctx: llamactx.LlamaContext,
    engine: llamactx.Engine,
    sizes: Sizes,
    index: int,
) -> None:
    """Scenario 2: ``sizes.single_pairs`` pairs of ``generate`` and the engine, each a new prompt."""
    for pair in range(sizes.single_pairs):
        generate_rate, engine_rate, same, count = single_pair(
            model, ctx, engine, sizes, seed=10**6 + index * 100 + pair
        )
        tally.record("single generate", generate_rate)
        tally.record("single engine", engine_rate)
        if not same or count != sizes.tg:
            tally.checks.append(f"round {index}: one request: same text {same}, {count} tokens, not {sizes.tg}")


def prefix_round(tally: Tally, model: llamactx.LlamaModel, threads: int, sizes: Sizes, index: int) -> None:
    """Scenario 3 with the cache on and off, alternating which goes first so neither always
    follows the other; skipped for good when the engine has no ``prefix_cache`` option yet."""
    for cache in (True, False) if index % 2 == 0 else (False, True):
        try:
            median, counts = prefix_ttft(model, threads, sizes, cache)
        except TypeError as error:
            tally.skipped["prefix cache"] = f"Engine(prefix_cache=...) refused: {error}"
            print(f"skipped the prefix-cache scenario: {error}")
            return
        label = f"cache {'on' if cache else 'off'}"
        tally.record(f"prefix TTFT median, {label}", median)
        tally.cached.setdefault(label, []).extend(counts)


def measure(
    model: llamactx.LlamaModel, path: str, bin_dir: Path | None, threads: int, sizes: Sizes, rounds: int
) -> dict[str, Any]:
    """All three scenarios, ``rounds`` times each; runs, medians, ratios, checks, skips."""
    tally = Tally()
    binary = bin_dir / "llama-batched-bench" if bin_dir else None
    if binary is None or not binary.is_file():
        tally.skipped["llama-batched-bench"] = f"not found ({binary or 'no --bin'}): aggregate ratios not measured"
        print(f"skipped llama-batched-bench: {tally.skipped['llama-batched-bench']}")
        binary = None
    # One engine and one context for scenario 2, made once: its prompts differ pair by pair.
    single_options = context_options(threads, 1, n_ctx_for(1, sizes.pp + sizes.tg))
    single_ctx = model.new_context(**single_options)
    with llamactx.Engine(model, **single_options) as single_engine:
        for index in range(rounds):
            aggregate_round(tally, model, path, binary, threads, sizes, index)
            single_round(tally, model, single_ctx, single_engine, sizes, index)
            if "prefix cache" not in tally.skipped:
                prefix_round(tally, model, threads, sizes, index)
    return summarize(tally, sizes)


def summarize(tally: Tally, sizes: Sizes) -> dict[str, Any]:
    """Medians of the rounds and the same-run ratios (targets: single >= 0.97, prefix >= 5)."""
    runs = tally.runs
    medians = {name: statistics.median(values) for name, values in runs.items()}
    pairs = {
        f"aggregate {n}x engine / llama-batched-bench": (
            f"aggregate {n}x engine",
            f"aggregate {n}x llama-batched-bench",
        )
        for n in sizes.parallel
    }
    pairs["single request engine / generate (target >= 0.97)"] = ("single engine", "single generate")
    pairs["prefix TTFT cache off / cache on (target >= 5)"] = (
        "prefix TTFT median, cache off",
        "prefix TTFT median, cache on",
    )
    ratios = {name: paired_ratio(runs[a], runs[b]) for name, (a, b) in pairs.items() if a in runs and b in runs}
    first_token = {str(n): {"p50": percentile(v, 0.5), "p95": percentile(v, 0.95)} for n, v in tally.ttft.items() if v}
    return {
        "medians": medians,
        "ratios": ratios,
        "first_token_seconds": first_token,
        "prefix_cached_tokens": {name: {"min": min(v), "max": max(v)} for name, v in tally.cached.items()},
        "checks": tally.checks or ["every request generated max_tokens tokens; engine and generate agreed"],
        "skipped": tally.skipped,
        "runs": runs,
    }


def chart(result: dict[str, Any], sizes: Sizes, threads: int, path: Path) -> None:
    """Aggregate tokens/s (engine, llama-batched-bench) and p50/p95 TTFT against N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    medians, first_token = result["medians"], result["first_token_seconds"]
    ns = list(sizes.parallel)
    figure, (rate_axis, ttft_axis) = plt.subplots(1, 2, figsize=(11, 4.5))
    for source, color in (("engine", "#4477aa"), ("llama-batched-bench", "#bbbbbb")):
        if f"aggregate {ns[0]}x {source}" in medians:
            rate_axis.plot(ns, [medians[f"aggregate {n}x {source}"] for n in ns], "o-", color=color, label=source)
    rate_axis.set(xlabel="requests at once (N)", ylabel="tokens/s, prompt + generated (median)", xticks=ns)
    rate_axis.set_title(f"aggregate throughput, PP {sizes.pp}, TG {sizes.tg}")
    rate_axis.legend()
    for key, style in (("p50", "o-"), ("p95", "s--")):
        ttft_axis.plot(ns, [first_token[str(n)][key] for n in ns], style, color="#4477aa", label=key)
    ttft_axis.set(xlabel="requests at once (N)", ylabel="seconds", xticks=ns, title="engine: time to first token")
    ttft_axis.legend()
    figure.suptitle(f"llamactx.Engine, SmolLM2-135M Q4_1, {threads} threads")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def run(
    model: llamactx.LlamaModel, path: str, bin_dir: Path | None, threads: int, sizes: Sizes, rounds: int, out: Path
) -> dict[str, Any]:
    """``measure``, then engine.json and engine.png into ``out``; the result (compare.py calls this)."""
    result = measure(model, path, bin_dir, threads, sizes, rounds)
    result = {"settings": {"threads": threads, "rounds": rounds, **asdict(sizes)}, **result}
    result["settings"]["ratios"] = "median over the rounds of each round's ratio"
    result["settings"]["prefix scenario"] = "questions submitted at once after the system prompt was served once"
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine.json").write_text(json.dumps(result, indent=2))
    chart(result, sizes, threads, out / "engine.png")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", type=Path, help="directory with llama-batched-bench")
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pp", type=int, help=f"prompt tokens per request (default {FULL.pp})")
    parser.add_argument("--tg", type=int, help=f"generated tokens per request (default {FULL.tg})")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round: a smoke test of this script")
    arguments = parser.parse_args()
    sizes = QUICK if arguments.quick else FULL
    sizes = replace(sizes, pp=arguments.pp or sizes.pp, tg=arguments.tg or sizes.tg)
    rounds = 1 if arguments.quick else arguments.rounds
    path = str(arguments.model or llamactx.default_model_path())
    model = llamactx.LlamaModel.load_from_file(path)
    result = run(model, path, arguments.bin, arguments.threads, sizes, rounds, arguments.out)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
