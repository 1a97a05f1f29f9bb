"""llamactx against llama.cpp's own llama-bench and llama-batched-bench, built from the same
llama.cpp source, alternating in one run on one machine; with --peer-python, also tg128 against
llama-cpp-python, each library in its own child process (benches/tg_protocol.py). Prints and
writes (JSON, PNG) medians and ratios (each the median of the rounds' ratios); then
benches/engine.py's engine benchmark, whose ratios join these (its own engine.json, engine.png).

    python benches/compare.py --bin DIR_WITH_LLAMA_BENCH [--rounds 5] [--threads 2] [--out bench-results]
                              [--peer-python .venv-peers/bin/python]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

from batched import SEQUENCES, batched_bench, high_level, low_level, no_eog_sampler, prompts

import engine
import llamactx
from llamactx.bench import generation_speed, prompt_speed

PP, TG = 512, 128


def llama_bench(
    binary: Path, model: str, threads: int, flash_attn: int, pp: int = PP, tg: int = TG
) -> dict[str, float]:
    """llama-bench's pp and tg tokens/s (one repetition each; 0 leaves a test out)."""
    command = [str(binary), "-m", model, "-t", str(threads), "-p", str(pp), "-n", str(tg), "-r", "1"]
    command += ["-fa", str(flash_attn), "-o", "json"]
    rows = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    return {("pp" if row["n_prompt"] else "tg"): float(row["avg_ts"]) for row in rows}


PEER_VERSION = "0.3.36"  # what `make bench-peers` installs
CHILDREN = {"llamactx": "tg_llamactx.py", "llama-cpp-python": "peer_llama_cpp_python.py"}


def tg_in_child_processes(peer_python: Path, model: str, threads: int, first: int) -> dict[str, float]:
    """tg128 of both libraries by benches/tg_protocol.py, each in a fresh process; ``first``
    (0 or 1) picks which runs first, so alternating it keeps either from always following the other."""
    pythons = {"llamactx": Path(sys.executable), "llama-cpp-python": peer_python}
    order = list(CHILDREN)[first:] + list(CHILDREN)[:first]
    rates: dict[str, float] = {}
    for library in order:
        script = Path(__file__).with_name(CHILDREN[library])
        command = [str(pythons[library]), str(script), model, str(threads)]
        child = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
        if library == "llama-cpp-python" and child["version"] != PEER_VERSION:
            raise SystemExit(f"llama-cpp-python {child['version']} found; make bench-peers installs {PEER_VERSION}")
        rates[f"tg128 {library} matched (child)"] = child["matched"]
        rates[f"tg128 {library} defaults (child)"] = child["defaults"]
    return rates


def paired_ratio(ours: list[float], theirs: list[float]) -> float:
    """The median over rounds of each round's ratio: both figures of a round were measured
    minutes apart at most, so the machine's drift between rounds cancels out."""
    return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))


def import_ms() -> float:
    """Median wall time of `import llamactx` in a fresh interpreter, of 5."""
    code = "import time; t = time.perf_counter(); import llamactx; print(time.perf_counter() - t)"
    command = [sys.executable, "-c", code]
    times = [float(subprocess.run(command, capture_output=True, text=True, check=True).stdout) for _ in range(5)]
    return 1000 * statistics.median(times)


def chart(medians: dict[str, float], threads: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(medians)
    figure, axis = plt.subplots(figsize=(10, 4.5))
    axis.barh(names, [medians[n] for n in names], color=["#4477aa" if "llamactx" in n else "#bbbbbb" for n in names])
    axis.set_xlabel("tokens/s (median)")
    axis.set_title(f"SmolLM2-135M Q4_1, {threads} threads: llamactx, llama.cpp's own tools, llama-cpp-python")
    for y, name in enumerate(names):
        axis.text(medians[name], y, f" {medians[name]:.0f}", va="center")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", type=Path, required=True, help="directory with llama-bench, llama-batched-bench")
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--peer-python", type=Path, help="a Python with llama-cpp-python (make bench-peers)")
    arguments = parser.parse_args()
    path = str(arguments.model or llamactx.default_model_path())
    model = llamactx.LlamaModel.load_from_file(path)
    threads = arguments.threads

    # llama-bench's defaults: flash attention off, n_batch 2048, n_ubatch 512.
    matched = model.new_context(
        n_ctx=PP + TG, n_batch=2048, n_ubatch=512, n_threads=threads, n_threads_batch=threads, flash_attn_type=0
    )
    default = model.new_context(n_ctx=PP + TG)  # what `new_context()` gives a user
    batched_ctx = model.new_context(
        n_ctx=2048, n_batch=2048, n_ubatch=512, n_seq_max=SEQUENCES, n_threads=threads, n_threads_batch=threads
    )
    token_lists, sampler = prompts(model), no_eog_sampler(model)
    token = model.token_bos()
    prompt_speed(matched, 16, token)
    runs: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        runs.setdefault(name, []).append(value)

    for round_index in range(arguments.rounds):
        if arguments.peer_python:
            for name, value in tg_in_child_processes(
                arguments.peer_python, path, threads, first=round_index % 2
            ).items():
                record(name, value)
        bench = llama_bench(arguments.bin / "llama-bench", path, threads, 0)
        record("pp512 llama-bench", bench["pp"])
        record("pp512 llamactx", prompt_speed(matched, PP, token))
        record("tg128 llama-bench", bench["tg"])
        record("tg128 llamactx", generation_speed(matched, TG, token))
        record("tg128 llamactx (defaults)", generation_speed(default, TG, token))
        record(
            "batched 8x llama-batched-bench",
            batched_bench(str(arguments.bin / "llama-batched-bench"), path, threads, SEQUENCES),
        )
        record("batched 8x llamactx low-level", low_level(batched_ctx, token_lists))
        record("batched 8x llamactx generate_batch", high_level(batched_ctx, token_lists, sampler))
    medians = {name: statistics.median(values) for name, values in runs.items()}
    overhead_us = 1e6 * min(timeit.repeat(lambda: matched.get_logits_ith(-1), number=200, repeat=5)) / 200
    pairs = {
        "pp512 llamactx / llama-bench": ("pp512 llamactx", "pp512 llama-bench"),
        "tg128 llamactx / llama-bench": ("tg128 llamactx", "tg128 llama-bench"),
        "batched low-level / llama-batched-bench": ("batched 8x llamactx low-level", "batched 8x llama-batched-bench"),
        "batched generate_batch / llama-batched-bench": (
            "batched 8x llamactx generate_batch",
            "batched 8x llama-batched-bench",
        ),
    }
    if arguments.peer_python:
        for setting in ("matched", "defaults"):
            pairs[f"tg128 llamactx / llama-cpp-python, {setting}"] = (
                f"tg128 llamactx {setting} (child)",
                f"tg128 llama-cpp-python {setting} (child)",
            )
    ratios = {name: paired_ratio(runs[ours], runs[theirs]) for name, (ours, theirs) in pairs.items()}
    # The engine's own benchmark (benches/engine.py) writes engine.json/engine.png; its ratios join these.
    engine_result = engine.run(model, path, arguments.bin, threads, engine.FULL, arguments.rounds, arguments.out)
    ratios |= {f"engine: {name}": value for name, value in engine_result["ratios"].items()}
    overheads = {
        "llamactx one-token decode round trip, ms": 1000 / medians["tg128 llamactx"],
        "llama-bench one-token decode, ms": 1000 / medians["tg128 llama-bench"],
        "get_logits_ith copy (n_vocab floats), microseconds": overhead_us,
        "import llamactx, ms (median of 5 fresh interpreters)": import_ms(),
    }
    settings = {
        "threads": threads,
        "pp": PP,
        "tg": TG,
        "rounds": arguments.rounds,
        "ratios": "median over the rounds of each round's ratio",
        "flash_attn": "off (both)",
        "n_batch": 2048,
        "n_ubatch": 512,
        "llamactx defaults": "new_context() as is (flash attention auto)",
        "against llama-cpp-python": f"{PEER_VERSION}, by benches/tg_protocol.py, one child process per library"
        if arguments.peer_python
        else "not run (make bench-peers)",
    }
    result = {"settings": settings, "medians": medians, "ratios": ratios, "overheads": overheads, "runs": runs}
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "compare.json").write_text(json.dumps(result, indent=2))
    chart(medians, threads, arguments.out / "compare.png")
    print(json.dumps({k: result[k] for k in ("settings", "medians", "ratios", "overheads")}, indent=2))


if __name__ == "__main__":
    main()
