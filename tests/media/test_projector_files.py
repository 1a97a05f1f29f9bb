"""Crafted projector (mmproj) files: each is refused with a typed error before llama.cpp's clip
loader reads it (``crates/llamactx-engine/src/media/projector_file.rs``), where the loader would
abort on an assertion or read through a null pointer at the first image. The cases run in child processes
(``support/children/corrupt_files.py``): a case that crashes one is named, and the rest go on in the next."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from support import synthetic
from support.audio import tone, wav
from support.images import random_png
from support.processes import reported_cases, run_child

import llamactx

U32, I32, F32, TEXT = (
    gguf.GGUFValueType.UINT32,
    gguf.GGUFValueType.INT32,
    gguf.GGUFValueType.FLOAT32,
    gguf.GGUFValueType.STRING,
)
LOADED = "loaded"
INVALID = "raised MtmdError InvalidProjector"
UNSUPPORTED = "raised MtmdError UnsupportedProjector"
#: Each case: the base file ("vision" or "audio"), the keys and tensors it changes
#: (``synthetic.rewrite_gguf``), and the outcome of loading it and encoding one input.
Case = tuple[str, dict[str, Any], dict[str, Any], str]
AUDIO_WIDTH = synthetic.AUDIO_PROJECTOR_WIDTH
CASES: dict[str, Case] = {
    "the vision projector as written": ("vision", {}, {}, LOADED),
    "heads that do not divide the width": ("vision", {"clip.vision.attention.head_count": (3, U32)}, {}, INVALID),
    "images past the position table": ("vision", {"clip.vision.image_size": (128, U32)}, {}, INVALID),
    "a NaN epsilon": ("vision", {"clip.vision.attention.layer_norm_epsilon": (float("nan"), F32)}, {}, INVALID),
    "a negative epsilon": ("vision", {"clip.vision.attention.layer_norm_epsilon": (-1.0, F32)}, {}, INVALID),
    "no output projection": ("vision", {}, {"mm.2.weight": None}, INVALID),
    "a block without its query": ("vision", {}, {"v.blk.1.attn_q.weight": None}, INVALID),
    "no position table": ("vision", {}, {"v.position_embd.weight": None}, INVALID),
    "another type's tensors": ("vision", {"clip.projector_type": ("qwen2vl_merger", TEXT)}, {}, INVALID),
    "the block count as text": ("vision", {"clip.vision.block_count": ("2", TEXT)}, {}, INVALID),
    "the width as a signed integer": ("vision", {"clip.vision.embedding_length": (64, I32)}, {}, INVALID),
    "a million blocks": ("vision", {"clip.vision.block_count": (10**6, U32)}, {}, INVALID),
    "fewer key-value heads": ("vision", {"clip.vision.attention.head_count_kv": (1, U32)}, {}, INVALID),
    "a bias narrower than its weight": ("vision", {}, {"mm.2.bias": np.zeros(8, np.float32)}, INVALID),
    "a type whose files are not checked": ("vision", {"clip.projector_type": ("minicpmv", TEXT)}, {}, UNSUPPORTED),
    "no encoder at all": ("vision", {"clip.has_vision_encoder": None}, {}, INVALID),
    "the audio projector as written": ("audio", {}, {}, LOADED),
    "a stack factor that does not divide a chunk": (
        "audio",
        {"clip.audio.projector.stack_factor": (7, U32)},
        {},
        INVALID,
    ),
    "a stack factor of 0": ("audio", {"clip.audio.projector.stack_factor": (0, U32)}, {}, INVALID),
    "a key bias Whisper refuses": ("audio", {}, {"a.blk.0.attn_k.bias": np.zeros(AUDIO_WIDTH, np.float32)}, INVALID),
    "a position table shorter than a chunk": (
        "audio",
        {},
        {"a.position_embd.weight": np.zeros((1000, AUDIO_WIDTH), np.float32)},
        INVALID,
    ),
    "no blocks": ("audio", {"clip.audio.block_count": (0, U32)}, {}, INVALID),
    "an even convolution kernel": (
        "audio",
        {},
        {"a.conv1d.1.weight": np.zeros((AUDIO_WIDTH, synthetic.AUDIO_PROJECTOR_MEL_BINS, 2), np.float32)},
        INVALID,
    ),
}


def run_cases(model_path: Path, cases: list[list[str]]) -> dict[str, str]:
    """Each case's outcome; a child that crashes is followed by another for the cases after."""
    outcomes: dict[str, str] = {}
    while cases:
        result = run_child(model_path, "corrupt_files", "load_each", stdin=json.dumps(cases), timeout=600)
        finished, started = reported_cases(result.stdout)
        outcomes.update(finished)
        if result.returncode == 0 or not started:
            break
        cause = [line for line in result.stderr.splitlines() if "GGML_" in line or "terminate" in line]
        outcomes[started[-1]] = f"crashed ({result.returncode}): {(cause or [result.stderr[-300:]])[0]}"
        cases = cases[[case[0] for case in cases].index(started[-1]) + 1 :]
    return outcomes


@pytest.fixture(scope="module")
def outcomes(model: llamactx.LlamaModel, model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("projectors")
    bases = {
        "vision": synthetic.write_tiny_projector(directory / "vision.gguf", model.n_embd()),
        "audio": synthetic.write_tiny_audio_projector(directory / "audio.gguf", model.n_embd()),
    }
    (directory / "image.png").write_bytes(random_png(64, 64, 2))
    (directory / "clip.wav").write_bytes(wav(tone(440, 1.0)))
    media = {"vision": directory / "image.png", "audio": directory / "clip.wav"}
    cases = []
    for number, (name, (base, keys, tensors, _)) in enumerate(CASES.items()):
        path = synthetic.rewrite_gguf(bases[base], directory / f"case-{number}.gguf", keys=keys, tensors=tensors)
        cases.append([name, "projector", str(path), str(media[base])])
    return run_cases(model_path, cases)


@pytest.mark.parametrize("case", CASES)
def test_a_crafted_projector_is_refused_before_llama_cpp_reads_it(outcomes: dict[str, str], case: str) -> None:
    assert outcomes.get(case, "did not run") == CASES[case][3]


def test_the_error_names_what_is_wrong(model: llamactx.LlamaModel, tmp_path: Path) -> None:
    base = synthetic.write_tiny_projector(tmp_path / "vision.gguf", model.n_embd())
    heads = synthetic.rewrite_gguf(base, tmp_path / "heads.gguf", keys={"clip.vision.attention.head_count": (3, U32)})
    with pytest.raises(llamactx.MtmdError, match="3 attention heads, which do not divide its width 64") as raised:
        llamactx.MtmdContext(model, heads)
    assert raised.value.kind == "InvalidProjector"
    other = synthetic.rewrite_gguf(base, tmp_path / "other.gguf", keys={"clip.projector_type": ("minicpmv", TEXT)})
    with pytest.raises(llamactx.MtmdError, match=r'"minicpmv" is not one whose files llamactx checks.*ultravox'):
        llamactx.MtmdContext(model, other)
