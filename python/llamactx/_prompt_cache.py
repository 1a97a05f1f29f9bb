"""Prompt caches that outlive the process: the engine's cached slots (the KV cells a finished
request leaves for the prefix cache) written to a directory, one file per slot, and read back
by a later engine, so that its first request on a long shared prompt reads only what follows it.

A file is ``MAGIC``, a JSON header (format version, the engine's identity, the payload's length
and SHA-256) behind its length, then the payload: llama.cpp's sequence state file, as
llama-server's ``/slots/{id}?action=save`` writes it. A file is restored only when its identity
is the engine's (the same model file, adapter and KV settings: ``identity``) and its bytes hash
to the header's; the state itself is then checked by the engine as any restore. The directory
holds at most ``max_bytes`` of these files: saving evicts the oldest past it."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from llamactx._llamactx import LlamaCppError

__all__ = ["DEFAULT_MAX_BYTES", "KV_OPTIONS", "identity", "load", "save", "write_whole"]

logger = logging.getLogger("llamactx")

MAGIC = b"LLAMACTX-KV\n"
VERSION = 1
SUFFIX = ".llamactx-kv"
#: The longest header read (its length is the file's to say).
MAX_HEADER = 4096
#: A prompt cache directory's size by default.
DEFAULT_MAX_BYTES = 2**30
#: The engine options that change what the KV cells hold, or how they are laid out (a
#: sequence's state records the KV streams: one per sequence, or one in all with ``kv_unified``):
#: a cache made under others is another engine's.
KV_OPTIONS = (
    "cache_type_k",
    "cache_type_v",
    "flash_attn_type",
    "rope_freq_base",
    "rope_freq_scale",
    "n_seq_max",
    "kv_unified",
)
#: Bytes read from each end of a model or adapter file for its identity (a GGUF's header,
#: metadata and vocabulary come first).
SAMPLE = 8 * 2**20


def _sample(digest: Any, path: Path) -> None:
    """Adds ``path``'s size and the bytes at both of its ends to ``digest``."""
    size = path.stat().st_size
    digest.update(f"{size}\n".encode())
    with path.open("rb") as file:
        digest.update(file.read(SAMPLE))
        file.seek(max(SAMPLE, size - SAMPLE))
        digest.update(file.read(SAMPLE))


def identity(model: Path, adapter: tuple[Path, float] | None, options: Mapping[str, Any]) -> str:
    """What makes cached cells reusable by an engine: its model file, its LoRA adapter's file
    and scale (both sampled at their ends and sized, not read whole), and its ``KV_OPTIONS``."""
    digest = hashlib.sha256()
    _sample(digest, model)
    if adapter is not None:
        _sample(digest, adapter[0])
    settings = {name: options.get(name) for name in KV_OPTIONS}
    settings["lora_scale"] = None if adapter is None else adapter[1]
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def _name(payload: bytes) -> str:
    """A file's name: the hash of the tokens its payload holds (the same prefix, the same file)."""
    (count,) = struct.unpack_from("<I", payload, 8)
    return hashlib.sha256(payload[12 : 12 + 4 * count]).hexdigest()[:32] + SUFFIX


def _entries(directory: Path) -> list[Path]:
    """The directory's cache files, newest first."""
    paths = [path for path in directory.glob("*" + SUFFIX) if path.is_file()]
    return sorted(paths, key=lambda path: path.stat().st_mtime_ns, reverse=True)


def write_whole(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` as a partial file renamed over it (a reader never sees half a
    file), making its directory (mode 0700) if missing."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def save(payloads: Iterable[bytes], directory: Path, engine_identity: str, max_bytes: int) -> int:
    """Writes each payload (a slot's sequence state file) into ``directory`` (made if missing),
    then removes the oldest cache files past ``max_bytes`` in all; a payload larger than that
    on its own is not written. Returns the files written."""
    written = 0
    for payload in payloads:
        header = json.dumps(
            {
                "version": VERSION,
                "identity": engine_identity,
                "bytes": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest(),
            }
        ).encode()
        entry = MAGIC + struct.pack("<I", len(header)) + header + payload
        if len(entry) > max_bytes:
            logger.warning("prompt cache: a slot of %d bytes is larger than the cache's %d", len(entry), max_bytes)
            continue
        write_whole(directory / _name(payload), entry)
        written += 1
    used = 0
    for path in _entries(directory) if directory.is_dir() else []:
        used += path.stat().st_size
        if used > max_bytes:
            path.unlink(missing_ok=True)
    return written


def _payload(entry: bytes, engine_identity: str) -> tuple[bytes | None, str]:
    """The payload of a cache file, or None and why it is refused."""
    if not entry.startswith(MAGIC) or len(entry) < len(MAGIC) + 4:
        return None, "not a prompt cache file"
    (length,) = struct.unpack_from("<I", entry, len(MAGIC))
    start = len(MAGIC) + 4
    if length > MAX_HEADER or len(entry) < start + length:
        return None, "its header is cut short or too long"
    try:
        header = json.loads(entry[start : start + length])
    except ValueError:
        return None, "its header is not JSON"
    payload = entry[start + length :]
    if not isinstance(header, dict) or header.get("version") != VERSION:
        return None, "it is of another format version"
    if header.get("identity") != engine_identity:
        return None, "another model, adapter or KV setting made it"
    if header.get("bytes") != len(payload) or header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return None, "its bytes are not those it was saved with"
    return payload, ""


def load(restore: Callable[[bytes], object], directory: Path, engine_identity: str, max_bytes: int, slots: int) -> int:
    """Restores the newest of ``directory``'s cache files (up to ``slots`` of them, at most
    ``max_bytes`` in all) with ``restore``; a file refused (another identity, corrupt, a state
    the engine refuses) is left alone and logged. Returns the files restored."""
    restored, used = 0, 0
    for path in _entries(directory) if directory.is_dir() else []:
        if restored == slots:
            break
        size = path.stat().st_size
        if used + size > max_bytes:
            continue
        payload, why = _payload(path.read_bytes(), engine_identity)
        if payload is None:
            logger.warning("prompt cache: %s refused: %s", path.name, why)
            continue
        try:
            restore(payload)
        except (LlamaCppError, ValueError) as error:
            logger.warning("prompt cache: %s refused: %s", path.name, error)
            continue
        used += size
        restored += 1
    return restored
