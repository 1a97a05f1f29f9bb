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
