"""What Ray adds to batch inference, in one run: rows/s of the same prompts through one local
``Engine`` (the baseline), and through a Ray Data job (``llamactx.ray.Predictor``) on a local
Ray of this machine's CPUs with 1 actor (all CPUs) and with 2 actors (half each). A job's time
includes starting its actors and loading the model in each, as a user's job does.

    python benches/ray_data.py [--rows 200] [--max-tokens 16] [--out bench-results]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import ray

import llamactx
import llamactx.ray

N_SEQ = 8
N_CTX = 4096


def prompts(rows: int) -> list[str]:
    subjects = ["France", "Italy", "Japan", "Spain", "Egypt", "Peru", "Canada", "Kenya", "India", "Chile"]
    return [f"{n}. Tell me about {subjects[n % len(subjects)]}:" for n in range(rows)]


def local_engine(path: Path, texts: list[str], max_tokens: int, threads: int) -> float:
    started = time.perf_counter()
    with (
        llamactx.LlamaModel.load_from_file(path) as model,
        llamactx.Engine(
            model, max_waiting=len(texts), n_ctx=N_CTX, n_seq_max=N_SEQ, n_threads=threads, n_threads_batch=threads
        ) as engine,
    ):
        for request in [engine.submit(text, max_tokens=max_tokens) for text in texts]:
            request.result()
    return len(texts) / (time.perf_counter() - started)


def ray_job(path: Path, texts: list[str], max_tokens: int, actors: int, cpus: int) -> float:
    started = time.perf_counter()
    done = (
        ray.data.from_items([{"prompt": text} for text in texts])
        .map_batches(
            llamactx.ray.Predictor,
            fn_constructor_kwargs={"model_path": str(path), "max_tokens": max_tokens, "n_seq_max": N_SEQ},
            concurrency=actors,
            num_cpus=cpus // actors,
            batch_size=32,
        )
        .take_all()
    )
    assert len(done) == len(texts)
    assert all(row["error"] is None for row in done)
    return len(texts) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    arguments = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    path = llamactx.default_model_path()
    texts = prompts(arguments.rows)
    rates: dict[str, float] = {"local engine": local_engine(path, texts, arguments.max_tokens, cpus)}
    ray.init(num_cpus=cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        ray_job(path, texts[:8], 2, 1, cpus)  # warm-up: Ray's worker processes and imports
        for actors in (1, 2):
            rates[f"ray data, {actors} actor{'s' if actors > 1 else ''}"] = ray_job(
                path, texts, arguments.max_tokens, actors, cpus
            )
    finally:
        ray.shutdown()
    result: dict[str, Any] = {
        "rows": arguments.rows,
        "max_tokens": arguments.max_tokens,
        "cpus": cpus,
        "rows_per_second": rates,
        "ratio_to_local_engine": {label: rate / rates["local engine"] for label, rate in rates.items()},
    }
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "ray_data.json").write_text(json.dumps(result, indent=2))
    for label, rate in rates.items():
        print(f"{label:>18}: {rate:6.1f} rows/s ({result['ratio_to_local_engine'][label]:.2f}x)")


if __name__ == "__main__":
    main()
