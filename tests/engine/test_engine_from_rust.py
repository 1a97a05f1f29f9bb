"""The engine from Rust, without Python (``crates/llamactx-engine/examples/engine_stream.rs``, on
the engine core crate, which does not depend on PyO3): concurrent requests streamed from their own
threads, each text what the Python engine generates for the same prompt."""

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
    # that llama.cpp is not compiled again for the example. Selecting the extension's package
    # too makes cargo resolve the dependencies' features as for `make build` (numpy turns on
    # num-traits' `i128`, a no-op, which alone would make `image`, and the core above it, a
    # second build): the core is the extension's, and cargo compiles the example only.
    target = os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache/llamactx/target"))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "CARGO_TARGET_DIR": target, "PATH": path}
    build = [sys.executable, "scripts/llamactx_build.py", "cargo", "build", "--quiet", "--release"]
    build += ["-p", "llamactx", "-p", "llamactx-engine", "--example", "engine_stream"]
    built = subprocess.run(build, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1100, check=False)
    assert built.returncode == 0, built.stderr[-4000:]
    example = Path(target) / "release" / "examples" / "engine_stream"
    command = [str(example), llamactx.default_model_path(), str(MAX_TOKENS), *PROMPTS]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    # A program of the engine core alone: no libpython linked in.
    linked = subprocess.run(["ldd", str(example)], capture_output=True, text=True, check=True)
    assert "libpython" not in linked.stdout, linked.stdout
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


def test_the_engine_core_crate_does_not_depend_on_pyo3() -> None:
    """``crates/llamactx-engine`` builds without PyO3 (the extension converts its ``Error``)."""
    tree = subprocess.run(
        ["cargo", "tree", "--offline", "-p", "llamactx-engine", "-e", "normal,build", "--prefix", "none"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    crates = {line.split()[0] for line in tree.splitlines() if line.strip()}
    assert {"llamactx-engine", "llama-cpp-4", "llguidance"} <= crates
    assert not {name for name in crates if name.startswith(("pyo3", "numpy"))}, sorted(crates)
