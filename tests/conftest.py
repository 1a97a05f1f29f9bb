"""Shared fixtures: the real model (fetched once into the cache) and fresh contexts on it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import synthetic

import llamactx

PARIS_PROMPT = "The capital of France is"
#: A system turn for chats that expect a right answer: without one, SmolLM2's template writes its
#: own ("You are a helpful AI assistant named SmolLM..."), after which this small model answers
#: "What is the capital of France?" off the mark.
HELPFUL = "You are a helpful assistant."
CHILDREN = Path(__file__).with_name("children")
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def model_path() -> Path:
    return llamactx.default_model_path()


@pytest.fixture(scope="session")
def model(model_path: Path) -> llamactx.LlamaModel:
    return llamactx.LlamaModel.load_from_file(model_path)


@pytest.fixture(scope="session")
def paris(model: llamactx.LlamaModel) -> int:
    """The token of " Paris", the greedy continuation of ``PARIS_PROMPT``."""
    (token,) = model.str_to_token(" Paris", False)
    return token


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


def run_child(
    model_path: Path, program: str, case: str, *, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs ``case`` of ``tests/children/PROGRAM.py`` on the model in a fresh interpreter, so a
    crash fails one test instead of killing pytest (see ``children/harness.py``)."""
    return subprocess.run(
        [sys.executable, str(CHILDREN / f"{program}.py"), str(model_path), case],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def paris_ctx(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext) -> llamactx.LlamaContext:
    """A fresh context that has decoded ``PARIS_PROMPT``."""
    decode_prompt(ctx, model.str_to_token(PARIS_PROMPT, False))
    return ctx
