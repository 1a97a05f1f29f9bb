"""The portable wheel against the native source build and against llama-bench built natively from
the same llama.cpp source: pp512 and tg128, alternating in one run on one machine.

Each llamactx figure comes from benches/throughput.py in a fresh process of its own Python: the
development venv (``make build``: -march=native) or the venv the wheel is installed in (``make
test-wheel``'s). Ratios are the median over rounds of each round's ratio.

    python benches/wheel.py --bin DIR_WITH_LLAMA_BENCH --wheel-python .venv-wheel/bin/python [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from compare import PP, TG, llama_bench, paired_ratio

import llamactx

THROUGHPUT = Path(__file__).with_name("throughput.py")
#: Prints the build the wheel chose and why.
VARIANT = "import llamactx, json; v = llamactx.cpu_variant(); print(json.dumps([v.name, v.reason]))"


def throughput(python: Path, model: str, threads: int) -> dict[str, float]:
    command = [str(python), str(THROUGHPUT), "--model", model, "--threads", str(threads), "--reps", "1"]
    result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    return {"pp": result[f"pp{PP}"], "tg": result[f"tg{TG}"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", type=Path, required=True, help="directory with llama-bench")
    parser.add_argument("--wheel-python", type=Path, required=True, help="a Python with the wheel installed")
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    arguments = parser.parse_args()
    model = str(arguments.model or llamactx.default_model_path())
    shown = subprocess.run([str(arguments.wheel_python), "-c", VARIANT], capture_output=True, text=True, check=True)
    build, reason = json.loads(shown.stdout)
    if build == "source":
        raise SystemExit(f"{arguments.wheel_python} runs a source build, not the wheel")
    subjects = {
        "wheel": lambda: throughput(arguments.wheel_python, model, arguments.threads),
        "native": lambda: throughput(Path(sys.executable), model, arguments.threads),
        "llama-bench": lambda: llama_bench(arguments.bin / "llama-bench", model, arguments.threads, 0),
    }
    runs: dict[str, list[float]] = {}
    for round_index in range(arguments.rounds):
        names = list(subjects)
        for name in names[round_index % 3 :] + names[: round_index % 3]:  # each goes first in turn
            for test, rate in subjects[name]().items():
                runs.setdefault(f"{test}{PP if test == 'pp' else TG} {name}", []).append(rate)
    ratios = {
        f"{test} wheel / {other}": paired_ratio(runs[f"{test} wheel"], runs[f"{test} {other}"])
        for test in (f"pp{PP}", f"tg{TG}")
        for other in ("native", "llama-bench")
    }
    settings = {
        "threads": arguments.threads,
        "rounds": arguments.rounds,
        "flash_attn": "off (all)",
        "wheel build": build,
        "why": reason,
    }
    result = {"settings": settings, "ratios": ratios, "runs": runs}
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "wheel.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({"settings": settings, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
