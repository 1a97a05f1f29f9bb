"""The command line and the streaming generator behind it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import llamactx
from conftest import PARIS_PROMPT


def test_generate_command_streams_paris(model_path: Path) -> None:
    command = [sys.executable, "-m", "llamactx", "generate", PARIS_PROMPT, "-m", str(model_path), "-n", "8"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(" Paris")


def test_info_command_prints_metadata(model_path: Path) -> None:
    command = [sys.executable, "-m", "llamactx", "info", "-m", str(model_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "general.architecture: llama" in result.stdout


def test_stream_joins_to_generate(ctx: llamactx.LlamaContext) -> None:
    pieces = list(llamactx.stream(ctx, PARIS_PROMPT, max_tokens=12))
    assert len(pieces) > 1
    assert "".join(pieces) == llamactx.generate(ctx, PARIS_PROMPT, max_tokens=12)
    assert pieces[0] == " Paris"


def test_stop_strings_end_generation_before_them(ctx: llamactx.LlamaContext) -> None:
    full = llamactx.generate(ctx, PARIS_PROMPT, max_tokens=20)
    assert "." in full
    stopped = llamactx.generate(ctx, PARIS_PROMPT, max_tokens=20, stop=["."])
    assert stopped == full[: full.index(".")]


def run_cli(*arguments: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "llamactx", *arguments]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=300, check=False)


def test_chat_command_keeps_the_conversation(model_path: Path) -> None:
    result = run_cli("chat", "-m", str(model_path), "-n", "20", stdin="What is the capital of France?\n\n")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_embed_command_writes_json_and_npy(model_path: Path, tmp_path: Path) -> None:
    import json

    import numpy as np

    result = run_cli("embed", "-m", str(model_path), "hello there", "good morning")
    assert result.returncode == 0, result.stderr
    vectors = np.array(json.loads(result.stdout)["embeddings"])
    assert vectors.shape == (2, 576)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    out = tmp_path / "vectors.npy"
    assert run_cli("embed", "-m", str(model_path), "-o", str(out), stdin="hello there\ngood morning\n").returncode == 0
    np.testing.assert_allclose(np.load(out), vectors, atol=1e-6)


def test_bench_command_reports_speeds(model_path: Path) -> None:
    result = run_cli("bench", "-m", str(model_path), "-p", "32", "-n", "8", "-r", "1")
    assert result.returncode == 0, result.stderr
    assert "pp32:" in result.stdout
    assert "tg8:" in result.stdout
