"""The portable wheel against the native source build and against llama-bench built natively from
the same llama.cpp source: pp512 and tg128, alternating in one run on one machine.

Each llamactx build runs in a child process of its own Python (benches/speed_worker.py) that
stays alive for the whole run: the development venv (``make build``: -march=native) or the venv
the wheel is installed in (``make test-wheel``'s). A round measures pp512 of the three
(llama-bench: a run of that test alone, one repetition after its warm-up), then tg128 of the
three, in an order that turns between rounds, so the figures compared were taken seconds apart;
each measurement waits until the previous one's idle threads have stopped polling. Ratios are the
median over rounds of each round's ratio.

    python benches/wheel.py --bin DIR_WITH_LLAMA_BENCH --wheel-python .venv-wheel/bin/python [--rounds 21]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from compare import PP, TG, llama_bench, paired_ratio

import llamactx

WORKER = Path(__file__).with_name("speed_worker.py")
#: The pause before each measurement: ggml's idle pool workers poll for about 0.17 s after a
#: computation, and a worker that measures while the other one's threads still spin shares the
#: cores with them.
SETTLE_SECONDS = 0.5
#: Prints the build the wheel chose and why.
VARIANT = "import llamactx, json; v = llamactx.cpu_variant(); print(json.dumps([v.name, v.reason]))"


class Worker:
    """A live benches/speed_worker.py child: one measurement per call."""

    def __init__(self, python: Path, model: str, threads: int) -> None:
        command = [str(python), str(WORKER), model, str(threads)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.read() != "ready":
            raise SystemExit(f"{python}: {WORKER.name} did not start")

    def read(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def measure(self, test: str) -> float:
        assert self.process.stdin is not None
        time.sleep(SETTLE_SECONDS)
        self.process.stdin.write(f"{test}\n")
        self.process.stdin.flush()
        return float(self.read())

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", type=Path, required=True, help="directory with llama-bench")
    parser.add_argument("--wheel-python", type=Path, required=True, help="a Python with the wheel installed")
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    arguments = parser.parse_args()
    model = str(arguments.model or llamactx.default_model_path())
    shown = subprocess.run([str(arguments.wheel_python), "-c", VARIANT], capture_output=True, text=True, check=True)
    build, reason = json.loads(shown.stdout)
    if build == "source":
        raise SystemExit(f"{arguments.wheel_python} runs a source build, not the wheel")
    workers = {
        "wheel": Worker(arguments.wheel_python, model, arguments.threads),
        "native": Worker(Path(sys.executable), model, arguments.threads),
    }
    binary = arguments.bin / "llama-bench"
    sizes = {"pp": {"pp": PP, "tg": 0}, "tg": {"pp": 0, "tg": TG}}
    measures: dict[str, Callable[[str], float]] = {
        "llama-bench": lambda test: llama_bench(binary, model, arguments.threads, 0, **sizes[test])[test],
        **{name: worker.measure for name, worker in workers.items()},
    }
    runs: dict[str, list[float]] = {}
    try:
        for round_index in range(arguments.rounds):
            names = list(measures)
            names = names[round_index % 3 :] + names[: round_index % 3]  # each goes first in turn
            for test, count in (("pp", PP), ("tg", TG)):
                for name in names:
                    runs.setdefault(f"{test}{count} {name}", []).append(measures[name](test))
    finally:
        for worker in workers.values():
            worker.close()
    ratios = {
        f"{test} wheel / {other}": paired_ratio(runs[f"{test} wheel"], runs[f"{test} {other}"])
        for test in (f"pp{PP}", f"tg{TG}")
        for other in ("native", "llama-bench")
    }
    settings = {
        "threads": arguments.threads,
        "rounds": arguments.rounds,
        "alternation": "per measurement, llamactx builds in live child processes",
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
