"""Shared fixtures: the real model (fetched once into the cache) and fresh contexts on it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import synthetic

import llamactx

PARIS_PROMPT = "The capital of France is"


@pytest.fixture(scope="session")
def model_path() -> Path:
    return llamactx.default_model_path()


@pytest.fixture(scope="session")
def model(model_path: Path) -> llamactx.LlamaModel:
    return llamactx.LlamaModel.load_from_file(model_path)


@pytest.fixture(scope="session")
def tiny_bert_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic.write_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert.gguf")


@pytest.fixture(scope="session")
def lora_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic.write_lora_for_smollm2(tmp_path_factory.mktemp("adapters") / "lora.gguf")


@pytest.fixture
def ctx(model: llamactx.LlamaModel) -> Iterator[llamactx.LlamaContext]:
    with model.new_context(n_ctx=512, n_batch=512) as context:
        yield context


def decode_prompt(ctx: llamactx.LlamaContext, tokens: list[int], seq_id: int = 0) -> None:
    """Decodes ``tokens`` into ``seq_id`` from position 0, with logits for the last one."""
    batch = llamactx.LlamaBatch(len(tokens))
    batch.add_sequence(tokens, seq_id, False)
    ctx.decode(batch)


def run_isolated(model_path: Path, code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter with ``model`` loaded, so a crash fails one test
    instead of killing pytest. The snippet sees ``llamactx``, ``model`` and ``MODEL_PATH``."""
    prelude = (
        f"import llamactx\nMODEL_PATH = {str(model_path)!r}\nmodel = llamactx.LlamaModel.load_from_file(MODEL_PATH)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def raised_in_subprocess(model_path: Path, call: str) -> str:
    """The name of the exception that ``call`` raises in a child process (``"none"`` if it
    returns). A crash of the child fails the calling test with its exit status."""
    code = f"""
    try:
        {call}
    except BaseException as error:
        print("RAISED", type(error).__name__)
    else:
        print("RAISED none")
    """
    result = run_isolated(model_path, code)
    assert result.returncode == 0, f"child died with {result.returncode}: {result.stderr[-2000:]}"
    return result.stdout.split("RAISED ", 1)[1].strip()
