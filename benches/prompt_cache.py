"""The prompt cache across a restart (``serve --prompt-cache-dir``): time to first token of a
restarted server's first request on a long shared system prompt, against a cold start's.

Each round starts the server on an empty cache directory, sends a question after the system
prompt (cold: the whole prompt is read), stops it (the cache is saved), starts it again on that
directory and sends another question after the same system prompt (warm: only the question is
read). Both first requests are timed from sending to the first streamed token; the ratio is
the median of the rounds'. The start-up of each server (load and, when warm, the restore) is
reported too.

    python benches/prompt_cache.py [--threads 2] [--rounds 3] [--repeat 40] [--out bench-results]

Writes prompt_cache.json into --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai
from server import free_port, started

import llamactx

SYSTEM = "You are a careful assistant for a travel company. Answer in plain English and be concise. "
QUESTIONS = ["Which city is the capital of France?", "What is a good time to visit Rome?"]


def first_token_seconds(url: str, prompt: str) -> tuple[float, int]:
    """Seconds from sending ``prompt`` to its first streamed token, and its cached tokens."""
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600) as api:
        sent = time.perf_counter()
        chunks = api.completions.create(
            model="m",
            prompt=prompt,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        first, cached = None, 0
        for chunk in chunks:
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.perf_counter() - sent
            if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
                cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
    return (first if first is not None else time.perf_counter() - sent), cached


def run(command: list[str], log: Path, prompt: str) -> tuple[float, float, int]:
    """Start-up seconds, first-token seconds and cached tokens of one server's first request."""
    port = free_port()
    began = time.perf_counter()
    with started([*command, "--port", str(port)], f"http://127.0.0.1:{port}", log) as url:
        startup = time.perf_counter() - began
        first, cached = first_token_seconds(url, prompt)
    return startup, first, cached


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=40, help="times the system prompt's sentence repeats")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    arguments = parser.parse_args()
    model = llamactx.default_model_path()
    system = SYSTEM * arguments.repeat
    n_system = len(llamactx.LlamaModel.load_from_file(model, vocab_only=True).str_to_token(system, False))
    rounds = []
    for number in range(arguments.rounds):
        with tempfile.TemporaryDirectory() as cache:
            serve = [sys.executable, "-m", "llamactx", "serve", "--model", str(model)]
            command = [*serve, "--threads", str(arguments.threads), "--parallel", "2", "--ctx", "8192"]
            command += ["--prompt-cache-dir", cache]
            logs = arguments.out / "logs"
            cold = run(command, logs / f"prompt-cache-cold-{number}.log", system + QUESTIONS[0])
            warm = run(command, logs / f"prompt-cache-warm-{number}.log", system + QUESTIONS[1])
        rounds.append({"cold": cold, "warm": warm, "ratio": warm[1] / cold[1]})
        print(
            f"round {number}: first token cold {cold[1]:.3f} s, after a restart {warm[1]:.3f} s "
            f"({warm[2]} of the prompt's tokens cached); start-up {cold[0]:.2f} s and {warm[0]:.2f} s"
        )
    summary = {
        "system_prompt_tokens": n_system,
        "first_token_seconds": {
            "cold": statistics.median(r["cold"][1] for r in rounds),
            "after_restart": statistics.median(r["warm"][1] for r in rounds),
        },
        "startup_seconds": {
            "cold": statistics.median(r["cold"][0] for r in rounds),
            "after_restart": statistics.median(r["warm"][0] for r in rounds),
        },
        "ratio_after_restart_vs_cold": statistics.median(r["ratio"] for r in rounds),
        "cached_tokens_after_restart": [r["warm"][2] for r in rounds],
    }
    print(json.dumps(summary, indent=2))
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "prompt_cache.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
