"""A response's choices as engine requests, read back over HTTP: awaited whole unless the client
leaves first (which cancels them), or streamed as their deltas come, merged, as server-sent
events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request as HttpRequest
from starlette.responses import StreamingResponse

from llamactx._engine import Delta, Request
from llamactx._llamactx import Completion
from llamactx._schema_check import OutputCheck

__all__ = ["Generation", "event_stream", "merged", "unless_disconnected"]


@dataclass
class Generation:
    """One choice of a response: its engine request, whether its prompt counts in usage, and the
    check of its JSON Schema's finished value, with the parameter that gave the schema."""

    request: Request
    index: int
    first_of_prompt: bool
    check: OutputCheck | None = None
    schema_param: str | None = None


def event_stream(events: AsyncIterator[str], headers: dict[str, str]) -> StreamingResponse:
    """Server-sent ``events``, unbuffered by proxies, with ``headers`` (the request's id)."""
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
    )


async def merged(generations: list[Generation]) -> AsyncIterator[tuple[int, Delta]]:
    """The deltas of all ``generations`` as they come, tagged with the generation's index."""
    if len(generations) == 1:
        async for delta in generations[0].request.adeltas():
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, Delta] | int | Exception] = asyncio.Queue()

    async def pump(generation: Generation) -> None:
        try:
            async for delta in generation.request.adeltas():
                queue.put_nowait((generation.index, delta))
            queue.put_nowait(generation.index)  # its end
        except Exception as error:  # handed to the reader, who raises it
            queue.put_nowait(error)

    tasks = [asyncio.ensure_future(pump(generation)) for generation in generations]
    try:
        running = len(generations)
        while running:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if isinstance(item, int):
                running -= 1
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


async def unless_disconnected(http: HttpRequest, requests: list[Request]) -> list[Completion] | None:
    """The requests' completions, or None (and the requests cancelled) if the client leaves
    first."""

    async def client_left() -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass

    results = asyncio.ensure_future(gather(requests))
    left = asyncio.ensure_future(client_left())
    try:
        await asyncio.wait({results, left}, return_when=asyncio.FIRST_COMPLETED)
        if results.done():
            return results.result()
        return None
    finally:
        left.cancel()
        if not results.done():
            results.cancel()
            for request in requests:
                request.cancel()


async def gather(requests: list[Request]) -> list[Completion]:
    return [await request for request in requests]
