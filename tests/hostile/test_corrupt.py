"""Truncated and bit-flipped model, session, state and sequence-state files: each raises an
exception and the process survives. All cases run in one child process
(``support/children/corrupt_files.py``), which prints each case before trying it, so a crash names the
case that caused it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from support import synthetic
from support.decoding import decode_prompt
from support.processes import reported_cases, run_child
from support.prompts import PARIS_PROMPT

import llamactx

SEED = 20261129


def truncations(data: bytes) -> list[tuple[str, bytes]]:
    """``data`` truncated at fixed sizes and fractions."""
    sizes = sorted({0, 3, 4, 16, 100, 1000, len(data) // 2, len(data) - 1})
    return [(f"truncated to {n} bytes", data[:n]) for n in sizes]


def bit_flips(size: int, header_size: int, count: int) -> list[list[tuple[int, int]]]:
    """``count`` sets of 1 to 4 bit flips, each an offset in the first ``header_size`` bytes of
    ``size`` and the mask XORed into the byte there."""
    rng = random.Random(SEED)
    return [
        [(rng.randrange(min(header_size, size)), 1 << rng.randrange(8)) for _ in range(rng.randint(1, 4))]
        for _ in range(count)
    ]


def mutations(data: bytes, header_size: int, count: int) -> list[tuple[str, bytes]]:
    """Truncations, and bit flips in the first ``header_size`` bytes."""
    cases = truncations(data)
    for k, flips in enumerate(bit_flips(len(data), header_size, count)):
        flipped = bytearray(data)
        for offset, mask in flips:
            flipped[offset] ^= mask
        cases.append((f"bit flips #{k}", bytes(flipped)))
    return cases


def write_cases(directory: Path, prefix: str, cases: list[tuple[str, bytes]]) -> list[tuple[str, Path]]:
    paths = []
    for n, (name, data) in enumerate(cases):
        path = directory / f"{prefix}-{n}.bin"
        path.write_bytes(data)
        paths.append((f"{prefix}: {name}", path))
    return paths


@pytest.fixture(scope="module")
def saved(model: llamactx.LlamaModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    directory = tmp_path_factory.mktemp("saved")
    tokens = model.str_to_token(PARIS_PROMPT, False)
    with model.new_context(n_ctx=256, n_seq_max=2) as ctx:
        decode_prompt(ctx, tokens)
        ctx.save_session_file(directory / "session", tokens)
        ctx.state_save_file(directory / "state", tokens)
        ctx.state_seq_save_file(directory / "seq", 0, tokens)
        return {
            "session": (directory / "session").read_bytes(),
            "state-file": (directory / "state").read_bytes(),
            "seq-file": (directory / "seq").read_bytes(),
            "state-bytes": ctx.state_get_data(),
            "seq-bytes": ctx.state_seq_get_data(0),
        }


@pytest.mark.timeout(1000)
def test_corrupted_files_raise_and_the_process_survives(
    model_path: Path, saved: dict[str, bytes], tmp_path: Path
) -> None:
    cases: list[tuple[Any, ...]] = []
    gguf = model_path.read_bytes()
    for name, path in write_cases(tmp_path, "model", truncations(gguf)):
        cases.append((name, "model", str(path)))
    # The model's bit flips are made by the child in one copy, each undone after its load:
    # writing 24 copies of the model took about 7 s.
    copy = tmp_path / "model-copy.gguf"
    copy.write_bytes(gguf)
    for k, flips in enumerate(bit_flips(len(gguf), 1 << 20, 24)):
        cases.append((f"model: bit flips #{k}", "model-flips", str(copy), flips))
    duplicate_vocab = synthetic.write_tiny_bert(tmp_path / "dupe.gguf", duplicate_token=True)
    cases.append(("model: vocabulary with a duplicate token", "model", str(duplicate_vocab)))
    for kind, data in saved.items():
        for name, path in write_cases(tmp_path, kind, mutations(data, 4096, 12)):
            cases.append((name, kind, str(path)))
    result = run_child(model_path, "corrupt_files", "load_each", stdin=json.dumps(cases), timeout=900)
    outcomes, started = reported_cases(result.stdout)
    assert result.returncode == 0, f"crashed on {started[-1] if started else '?'}: {result.stderr[-1500:]}"
    assert "ALL DONE" in result.stdout
    assert len(outcomes) == len(cases)
    for name, outcome in outcomes.items():
        if "truncated" in name or "duplicate" in name:
            assert outcome.startswith("raised"), f"{name}: {outcome}"
    assert outcomes["model: vocabulary with a duplicate token"] == "raised LlamaModelLoadError InvalidVocabulary"
    raised = sum(outcome.startswith("raised") for outcome in outcomes.values())
    assert raised > len(cases) // 2, outcomes
