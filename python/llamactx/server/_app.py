"""The ASGI application: OpenAI's and Anthropic's routes on ``Serving``'s handlers, the API key
and the request metrics around them, and every failure as OpenAI's error object with its status
(Anthropic's on Anthropic's routes)."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from llamactx._engine import Engine
from llamactx._llamactx import LlamaContext
from llamactx._media import MediaBudget
from llamactx._reasoning import Reasoning
from llamactx.server._anthropic import Messages
from llamactx.server._anthropic_protocol import anthropic_error
from llamactx.server._media_urls import MediaUrlPolicy, MediaUrls
from llamactx.server._protocol import ApiError
from llamactx.server._responses import Responses
from llamactx.server._serving import CLIENT_GONE, Serving

__all__ = ["create_app"]

logger = logging.getLogger("llamactx.server")

#: Bodies larger than this are refused with 413 before they are read whole.
DEFAULT_MAX_BODY_BYTES = 4 * 2**20
#: The one route open without the API key.
HEALTH = "/health"
#: Where OpenAI's routes are served: under ``/v1``, and at the root for clients whose base URL
#: has no ``/v1`` (as llama-server serves them).
OPENAI_PREFIXES = ("/v1", "")
#: Anthropic's Messages API: its errors have Anthropic's shape, and its API key may also come as
#: ``x-api-key`` (as Anthropic's clients send it).
ANTHROPIC_ROUTES = "/v1/messages"


def _routes(serving: Serving) -> list[Route]:
    responses = Responses(serving)
    openai_routes = [
        ("/models", serving.list_models, "GET"),
        ("/models/{model:path}", serving.get_model, "GET"),
        ("/completions", serving.completions, "POST"),
        ("/chat/completions", serving.chat, "POST"),
        ("/embeddings", serving.embeddings_route, "POST"),
        ("/responses", responses.create, "POST"),
        ("/responses/{response_id}", responses.retrieve, "GET"),
        ("/responses/{response_id}", responses.delete, "DELETE"),
    ]
    messages = Messages(serving)
    return [
        Route(HEALTH, serving.health, methods=["GET"]),
        Route("/metrics", serving.metrics_text, methods=["GET"]),
        Route(ANTHROPIC_ROUTES, messages.create, methods=["POST"]),
        Route(f"{ANTHROPIC_ROUTES}/count_tokens", messages.count_tokens, methods=["POST"]),
        *(
            Route(prefix + path, handler, methods=[method])
            for prefix in OPENAI_PREFIXES
            for path, handler, method in openai_routes
        ),
    ]


class _Guard:
    """ASGI middleware: the API key (except for ``/health``), and the request's metrics, by
    route: the fixed paths of ``routes``, any other as "other" (a bounded set of labels)."""

    def __init__(self, app: ASGIApp, serving: Serving, routes: list[Route]) -> None:
        self.app = app
        self.serving = serving
        self.names = frozenset(route.path for route in routes if not route.param_convertors)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = _route_path(scope)
        route = path if path in self.names else "other"
        started = time.perf_counter()
        status = 0

        async def tracked(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if route != HEALTH and not self._authorized(scope, path):
                how = "x-api-key: KEY or Authorization: Bearer KEY" if _anthropic(path) else "Authorization: Bearer KEY"
                error = ApiError(401, f"a valid API key is required ({how})", code="invalid_api_key")
                await _error_response(error, scope)(scope, receive, tracked)
            else:
                await self.app(scope, receive, tracked)
        finally:
            metrics = self.serving.metrics
            metrics.requests.labels(route, str(status or CLIENT_GONE)).inc()
            metrics.duration.labels(route).observe(time.perf_counter() - started)

    def _authorized(self, scope: Scope, path: str) -> bool:
        key = self.serving.api_key
        if key is None:
            return True
        accepted = {b"authorization": b"Bearer " + key.encode()}
        if _anthropic(path):
            accepted[b"x-api-key"] = key.encode()
        return any(hmac.compare_digest(value, accepted[name]) for name, value in scope["headers"] if name in accepted)


def _route_path(scope: Scope) -> str:
    return str(scope["path"]).removeprefix(scope.get("root_path", ""))  # as mounted in another app


def _anthropic(path: str) -> bool:
    return path == ANTHROPIC_ROUTES or path.startswith(f"{ANTHROPIC_ROUTES}/")


def _error_response(error: ApiError, scope: Scope) -> JSONResponse:
    body = anthropic_error(error) if _anthropic(_route_path(scope)) else error.body()
    return JSONResponse(body, status_code=error.status, headers=error.headers())


async def _api_error(http: HttpRequest, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return _error_response(error, http.scope)


async def _http_error(http: HttpRequest, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    if error.status_code == 404:
        return _error_response(ApiError(404, f"no route {http.method} {http.url.path}", code="not_found"), http.scope)
    return _error_response(ApiError(error.status_code, str(error.detail)), http.scope)


async def _unexpected(http: HttpRequest, error: Exception) -> Response:
    logger.exception("unexpected failure in %s %s", http.method, http.url.path)
    return _error_response(ApiError(500, f"internal error: {type(error).__name__}"), http.scope)


def create_app(
    engine: Engine,
    *,
    model_id: str | None = None,
    model_aliases: Sequence[str] = (),
    strict_model: bool = False,
    api_key: str | None = None,
    embeddings: LlamaContext | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    media_urls: MediaUrlPolicy | None = None,
    media_budget: MediaBudget = MediaBudget(),
    chat_template_kwargs: Mapping[str, Any] | None = None,
    reasoning: Reasoning = Reasoning(),
) -> Starlette:
    """An ASGI application serving OpenAI's API with ``engine``: ``/v1/models``,
    ``/v1/completions``, ``/v1/chat/completions`` (streamed as server-sent events or not),
    ``/v1/embeddings``, ``/v1/responses`` (the Responses API, streamed or not; the last
    ``MAX_STORED_RESPONSES`` responses are kept in memory for ``previous_response_id`` and
    ``GET``/``DELETE /v1/responses/{id}``) (each also without ``/v1``), Anthropic's Messages
    API (``/v1/messages``, streamed or not, and ``/v1/messages/count_tokens``; errors there are
    Anthropic's error objects), ``/health`` and ``/metrics`` (Prometheus).

    ``model_id`` is the model's name in responses and ``/v1/models`` (default: the model's file
    name, without ``.gguf``), which also lists ``model_aliases``; requests may name any model, or
    none, unless ``strict_model``: then only ``model_id`` and the aliases (404 otherwise, 400
    without ``model``);
    ``api_key``, when set, is required as ``Authorization: Bearer KEY`` (or, on Anthropic's routes,
    ``x-api-key: KEY``) everywhere but ``/health``; ``embeddings``, a context made with ``embeddings=True``, serves
    ``/v1/embeddings``; bodies over ``max_body_bytes`` get 413. Chats' ``http(s)://`` image URLs
    are refused (400) unless ``media_urls`` allows fetching them (and the engine has a projector
    that reads images): only public addresses or the policy's networks, within its size limit and
    timeout (``MediaUrlPolicy``). A chat's images and audio are read under ``media_budget``
    (400 naming the limit past it), and a prompt that cannot fit a sequence, its media's tokens
    included, is a 400 ``context_length_exceeded`` before any image is encoded.
    ``chat_template_kwargs`` are variables of the chat template for every chat, on every API
    (llama-server's ``--chat-template-kwargs``); a chat request's own ``chat_template_kwargs``
    override them one by one. ``reasoning`` is how every chat's reasoning is handled, for a
    thinking model's template (llama-server's ``--reasoning-format`` and ``--reasoning-budget``):
    split into the message's ``reasoning_content`` (streamed as deltas of their own), Anthropic's
    ``thinking`` blocks and the Responses API's ``reasoning`` items; a chat request's
    ``reasoning_format`` overrides its format, Anthropic's ``thinking.budget_tokens`` its budget.
    The app does not
    own the engine:
    close it when the app is done. Mount it in another Starlette or FastAPI app as any ASGI app.
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    if media_urls is not None and (engine.mtmd is None or not engine.mtmd.supports_vision()):
        raise ValueError("media_urls fetches images: the engine needs a projector that reads images (mtmd)")
    serving = Serving(
        engine,
        model_id or _default_model_id(engine),
        model_aliases,
        strict_model,
        api_key,
        embeddings,
        max_body_bytes,
        None if media_urls is None else MediaUrls(media_urls),
        media_budget,
        chat_template_kwargs,
        reasoning,
    )
    routes = _routes(serving)
    handlers: dict[Any, Callable[[HttpRequest, Exception], Awaitable[Response]]] = {
        ApiError: _api_error,
        HTTPException: _http_error,
        Exception: _unexpected,
    }
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.add_middleware(_Guard, serving=serving, routes=routes)
    return app


def _default_model_id(engine: Engine) -> str:
    """The model's file name without ``.gguf``, as llama-server names it."""
    return Path(engine.model.path).name.removesuffix(".gguf")
