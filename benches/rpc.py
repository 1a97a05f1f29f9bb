"""A model on llama.cpp RPC servers over loopback, against the same model local, in one run:
prompt (pp) and generation (tg) tokens/s of the default model local, on one `llamactx
rpc-server` and split across two, as ratios to local. On one machine the servers compete with
the client for the same cores, and every layer's activations cross a socket: this measures
the protocol's and the relay's cost, not the gain of more machines. Every configuration
computes with the same threads (default 1, so that a server and the client's spinning RPC
dispatcher fit this machine's 2 cores).

    python benches/rpc.py [--threads 1] [--pp 256] [--tg 64] [--repetitions 3] [--out bench-results]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import llamactx
from llamactx.bench import speeds

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from support.rpc_serving import rpc_servers  # the tests' server helper, not a copy


def measure(model: llamactx.LlamaModel, threads: int, pp: int, tg: int, repetitions: int) -> dict[str, float]:
    with model.new_context(n_ctx=pp + tg, n_batch=pp, n_threads=threads, n_threads_batch=threads) as ctx:
        return speeds(ctx, pp=pp, tg=tg, repetitions=repetitions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pp", type=int, default=256)
    parser.add_argument("--tg", type=int, default=64)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    arguments = parser.parse_args()
    path = llamactx.default_model_path()
    runs: dict[str, dict[str, float]] = {}
    measured = (arguments.threads, arguments.pp, arguments.tg, arguments.repetitions)
    with llamactx.LlamaModel.load_from_file(path) as local:
        runs["local"] = measure(local, *measured)
    with rpc_servers(2, "--threads", str(arguments.threads)) as servers:
        endpoints = [server.endpoint for server in servers]
        for label, chosen in (("1 server", endpoints[:1]), ("2 servers", endpoints)):
            with llamactx.LlamaModel.load_from_file(path, rpc_servers=chosen) as remote:
                runs[label] = measure(remote, *measured)
    result: dict[str, Any] = {"model": path.name, "threads": arguments.threads, "tokens_per_second": runs}
    result["ratio_to_local"] = {
        label: {test: rate / runs["local"][test] for test, rate in speeds_.items()} for label, speeds_ in runs.items()
    }
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "rpc.json").write_text(json.dumps(result, indent=2))
    for label, speeds_ in runs.items():
        ratios = result["ratio_to_local"][label]
        figures = (f"{test} {rate:8.1f} tok/s ({ratios[test]:.2f}x)" for test, rate in speeds_.items())
        print(f"{label:>9}: " + "  ".join(figures))


if __name__ == "__main__":
    main()
