"""The engine from Rust, without Python (``examples/engine_stream.rs``, on the crate's
``engine_api``): concurrent requests streamed from their own threads, each text what the Python
engine generates for the same prompt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import llamactx

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["The capital of France is", "One, two, three,", "def fib(n):", "Water boils at"]
MAX_TOKENS = 24


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_the_rust_example_streams_what_the_python_engine_generates(model: llamactx.LlamaModel) -> None:
    # The Makefile's target directory and toolchain (the venv's cmake and libclang first), so
    # that llama.cpp is not compiled again for the example.
    target = os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache/llamactx/target"))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "CARGO_TARGET_DIR": target, "PATH": path}
    command = [sys.executable, "scripts/llamactx_build.py", "cargo", "run", "--quiet", "--release"]
    command += ["--example", "engine_stream", "--", llamactx.default_model_path(), str(MAX_TOKENS), *PROMPTS]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1100, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    pieces = {
        index: [line["piece"] for line in lines if line["request"] == index and "piece" in line]
        for index in range(len(PROMPTS))
    }
    finished = [line for line in lines if "text" in line]
    assert [line["request"] for line in finished] == list(range(len(PROMPTS)))
    with llamactx.Engine(model, n_ctx=2048, n_seq_max=4) as engine:
        for line in finished:
            prompt = PROMPTS[line["request"]]
            assert line["prompt_tokens"] == model.str_to_token(prompt, model.add_bos_token())
            expected = engine.submit(line["prompt_tokens"], max_tokens=MAX_TOKENS).result()
            assert (line["text"], line["finish_reason"]) == (expected.text, expected.finish_reason)
            # Streamed: the text came in pieces, as generated, and they make it whole.
            assert len(pieces[line["request"]]) > 1
            assert "".join(pieces[line["request"]]) == line["text"]
