"""Truncated and bit-flipped model, session, state and sequence-state files: each raises an
exception and the process survives. All cases run in one child process
(``support/children/corrupt_files.py``), which prints each case before trying it, so a crash names the
case that caused it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from support import synthetic
from support.decoding import decode_prompt
from support.processes import reported_cases, run_child
from support.prompts import PARIS_PROMPT

import llamactx

SEED = 20261129


def mutations(data: bytes, header_size: int, count: int) -> list[tuple[str, bytes]]:
    """Truncations at fixed fractions, and bit flips in the first ``header_size`` bytes."""
    rng = random.Random(SEED)
    cases = [
        (f"truncated to {n} bytes", data[:n]) for n in sorted({0, 3, 4, 16, 100, 1000, len(data) // 2, len(data) - 1})
    ]
    for k in range(count):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(min(header_size, len(data)))] ^= 1 << rng.randrange(8)
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
    cases: list[tuple[str, str, str]] = []
    gguf = model_path.read_bytes()
    for name, path in write_cases(tmp_path, "model", mutations(gguf, 1 << 20, 24)):
        cases.append((name, "model", str(path)))
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
