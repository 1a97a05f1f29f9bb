"""Loads each damaged file listed on stdin (see test_corrupt.py, test_projector_files.py): a
JSON list of ``[name, kind, path]``, ``[name, "projector", path, media]`` for a projector that
must also read the image or audio file ``media``, or ``[name, "model-flips", path, flips]`` for
the model at ``path`` with each ``[offset, mask]`` of ``flips`` XORed into it for the load (and
undone after). Prints ``CASE name`` before each load, so that a crash names its case, and
``RESULT name => loaded`` or ``=> raised ExceptionName kind`` (the error's ``kind``, where it has
one) after it."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import harness

import llamactx


def load(model: llamactx.LlamaModel, kind: str, path: str, tokens: list[int], media: list[str]) -> None:
    """Loads ``path`` as a file of ``kind``; a damaged model must also survive a decode, a
    projector an encode of ``media``."""
    if kind == "projector":
        with llamactx.MtmdContext(model, path) as projector:
            chunks = projector.tokenize("<__media__> What is it?", [llamactx.MtmdBitmap.from_file(media[0])])
            with model.new_context(n_ctx=512) as ctx:
                projector.eval_chunks(ctx, chunks, 0, 0)
        return
    if kind == "model":
        loaded = llamactx.LlamaModel.load_from_file(path)
        ctx = loaded.new_context(n_ctx=256)
        batch = llamactx.LlamaBatch(len(tokens))
        batch.add_sequence(tokens, 0, False)
        ctx.decode(batch)
        return
    ctx = model.new_context(n_ctx=256, n_seq_max=2)
    if kind == "session":
        ctx.load_session_file(path, 64)
    elif kind == "state-file":
        ctx.state_load_file(path, 64)
    elif kind == "seq-file":
        ctx.state_seq_load_file(path, 1, 64)
    elif kind == "state-bytes":
        ctx.state_set_data(Path(path).read_bytes())
    elif kind == "seq-bytes":
        ctx.state_seq_set_data(Path(path).read_bytes(), 1)
    else:
        raise SystemExit(f"unknown kind {kind!r}")


@contextmanager
def flipped(path: str, flips: list[list[int]]) -> Iterator[None]:
    """The file at ``path`` with each ``[offset, mask]`` of ``flips`` XORed in, until the block
    ends (XORing again restores it, once the model loaded from it is freed)."""

    def xor() -> None:
        with Path(path).open("r+b") as file:
            for offset, mask in flips:
                byte = os.pread(file.fileno(), 1, offset)[0]
                os.pwrite(file.fileno(), bytes([byte ^ mask]), offset)

    xor()
    try:
        yield
    finally:
        xor()


def outcome(model: llamactx.LlamaModel, kind: str, path: str, tokens: list[int], media: list[str]) -> str:
    """What loading ``path`` as ``kind`` ends in; whatever it loaded is freed by the return."""
    try:
        load(model, kind, path, tokens, media)
    except Exception as error:
        return " ".join(["raised", type(error).__name__, *filter(None, [getattr(error, "kind", None)])])
    return "loaded"


def load_each(model: llamactx.LlamaModel) -> None:
    tokens = model.str_to_token("The capital of France is", False)
    for name, kind, path, *extra in json.load(sys.stdin):
        print("CASE", name, flush=True)
        if kind == "model-flips":
            with flipped(path, extra[0]):
                result = outcome(model, "model", path, tokens, [])
        else:
            result = outcome(model, kind, path, tokens, extra)
        print("RESULT", name, "=>", result, flush=True)
    print("ALL DONE")


if __name__ == "__main__":
    harness.run(load_each)
