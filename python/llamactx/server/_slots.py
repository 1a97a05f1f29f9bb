"""llama-server's slots, on the engine's sequences: ``GET /slots`` lists them; ``POST
/slots/{id}?action=save`` writes the slot's cached KV cells to a file of ``--slot-save-path``
(llama.cpp's sequence state file, as llama-server writes it: either server restores the
other's), ``action=restore`` reads one back for the prefix cache to reuse, ``action=erase``
empties the slot. A file is named by the body's ``filename``, a plain name inside that
directory, never a path."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from llamactx._prompt_cache import DEFAULT_MAX_BYTES, write_whole
from llamactx.server._api import Api
from llamactx.server._errors import ApiError, openai_error
from llamactx.server._openai_protocol import _Body

if TYPE_CHECKING:
    from llamactx.server._pipeline import Pipeline

__all__ = ["SlotFiles", "Slots"]

#: A slot file's name: letters, digits, ``.``, ``_`` and ``-``, not starting with a dot.
FILENAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class SlotFiles:
    """Where ``/slots/{id}?action=save|restore`` keep slot files (llama-server's
    ``--slot-save-path``; made by the first save if missing), and the largest file a restore
    reads."""

    directory: Path
    max_bytes: int = DEFAULT_MAX_BYTES


class SlotFileBody(_Body):
    filename: Annotated[str, Field(min_length=1, max_length=128)]


class Slots:
    """The slot actions on ``pipeline``'s engine, with files in ``pipeline.slot_files``."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def api(self) -> Api:
        """``GET /slots`` and ``POST /slots/{id}?action=...``, at the root as llama-server
        serves them."""
        return Api([("GET", "/slots", self.list_slots), ("POST", "/slots/{id_slot}", self.action)])

    async def list_slots(self, http: HttpRequest) -> Response:
        """Each slot: its id, cells (``n_ctx``), whether a request holds it, and its tokens."""
        engine = self.pipeline.engine
        slots = await asyncio.to_thread(engine.slots)
        listed = [
            {"id": slot, "n_ctx": engine.n_ctx_seq, "is_processing": busy, "n_tokens": tokens}
            for slot, busy, tokens in slots
        ]
        return JSONResponse(listed)

    async def action(self, http: HttpRequest) -> Response:
        action = http.query_params.get("action", "")
        try:
            slot = int(http.path_params["id_slot"])
        except ValueError:
            raise ApiError(400, "the slot id must be an integer", param="id_slot") from None
        if action == "erase":
            erased = await asyncio.to_thread(self._erase, slot)
            return JSONResponse({"id_slot": slot, "n_erased": erased})
        if action not in ("save", "restore"):
            raise ApiError(400, f"unknown action {action!r}: save, restore or erase", param="action")
        files = self.pipeline.slot_files
        if files is None:
            raise ApiError(501, "this server does not save slots: start it with --slot-save-path DIR")
        name = (await self.pipeline.body(http, SlotFileBody)).filename
        if not FILENAME.fullmatch(name):
            raise ApiError(400, "the filename must be a plain name (letters, digits, '.', '_', '-')", param="filename")
        path = files.directory / name
        began = time.perf_counter()
        if action == "save":
            tokens, size = await asyncio.to_thread(self._save, slot, path)
            counts: dict[str, Any] = {"n_saved": tokens, "n_written": size}
        else:
            tokens, size = await asyncio.to_thread(self._restore, slot, path, files.max_bytes)
            counts = {"n_restored": tokens, "n_read": size}
        timings = {f"{action}_ms": (time.perf_counter() - began) * 1000}
        return JSONResponse({"id_slot": slot, "filename": name, **counts, "timings": timings})

    def _erase(self, slot: int) -> int:
        try:
            return self.pipeline.engine.erase_slot(slot)
        except Exception as error:
            raise _refused(error, "the slot cannot be erased", "id_slot") from None

    def _save(self, slot: int, path: Path) -> tuple[int, int]:
        try:
            (file,) = self.pipeline.engine.save_slots(slot)
        except Exception as error:
            raise _refused(error, "the slot cannot be saved", "id_slot") from None
        write_whole(path, file)
        return int.from_bytes(file[8:12], "little"), len(file)

    def _restore(self, slot: int, path: Path, max_bytes: int) -> tuple[int, int]:
        if not path.is_file():
            raise ApiError(404, f"no slot file {path.name!r}", param="filename", code="not_found")
        size = path.stat().st_size
        if size > max_bytes:
            raise ApiError(400, f"the slot file has {size} bytes, more than this server reads ({max_bytes})")
        try:
            _, tokens = self.pipeline.engine.restore_slot(path.read_bytes(), slot)
        except Exception as error:
            raise _refused(error, "the slot file cannot be restored", "filename") from None
        return tokens, size


def _refused(error: Exception, doing: str, param: str) -> Exception:
    """``error`` as the client sees it; a slot the engine does not have is the request's fault."""
    if isinstance(error, IndexError):
        return ApiError(400, f"{doing}: {error}", param="id_slot")
    return openai_error(error, doing, param)
