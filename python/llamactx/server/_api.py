"""What a protocol registers with the app (``_app.PROTOCOLS``): its routes, the prefixes they are
served under, the shape of its errors and the headers its API key may come in. The app finds a
request's protocol by the route it matches, never by the look of its path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from llamactx.server._errors import ApiError

__all__ = ["KEY_HEADERS", "OPENAI_PREFIXES", "Api", "Handler"]

#: An endpoint's handler.
Handler = Callable[[HttpRequest], Awaitable[Response]]
#: Where OpenAI's routes are served (and the Responses API's): under ``/v1``, and at the root
#: for clients whose base URL has no ``/v1`` (as llama-server serves them).
OPENAI_PREFIXES = ("/v1", "")
#: How each header may carry the API key (``{}`` is the key), and the header's name as a
#: client's documentation spells it.
KEY_HEADERS = {"authorization": ("Bearer {}", "Authorization"), "x-api-key": ("{}", "x-api-key")}


def _openai_error_body(error: ApiError) -> Mapping[str, Any]:
    return error.body()


@dataclass(frozen=True)
class Api:
    """A protocol's endpoints: ``routes`` as (method, path, handler), each served under every one
    of ``prefixes``; its errors as ``error_body`` makes them (OpenAI's error object by default);
    its API key in any of ``key_headers`` (names of ``KEY_HEADERS``); and ``namespace``, a path
    whose subpaths no route matches are still its own (a 404 in its shape, its key headers)."""

    routes: Sequence[tuple[str, str, Handler]]
    prefixes: tuple[str, ...] = ("",)
    error_body: Callable[[ApiError], Mapping[str, Any]] = _openai_error_body
    key_headers: tuple[str, ...] = ("authorization",)
    namespace: str | None = None
