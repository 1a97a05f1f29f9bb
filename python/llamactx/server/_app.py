"""The ASGI application: each protocol's routes (``PROTOCOLS``, each on the one pipeline), the API
key and the request metrics around them, and every failure as the error object of the protocol
whose route it reached (OpenAI's elsewhere)."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from llamactx._engine import Engine
from llamactx._llamactx import LlamaContext
from llamactx._media import MediaBudget
from llamactx._reasoning import Reasoning
from llamactx.server._anthropic import Messages
from llamactx.server._api import KEY_HEADERS, Api
from llamactx.server._errors import CLIENT_GONE, ApiError
from llamactx.server._media_urls import MediaUrlPolicy, MediaUrls
from llamactx.server._openai import OpenAi
from llamactx.server._pipeline import Pipeline
from llamactx.server._rerank import Rerank
from llamactx.server._responses import Responses
from llamactx.server._slots import SlotFiles, Slots

__all__ = ["create_app"]

logger = logging.getLogger("llamactx.server")

#: Bodies larger than this are refused with 413 before they are read whole.
DEFAULT_MAX_BODY_BYTES = 4 * 2**20
#: The one route open without the API key.
HEALTH = "/health"
#: The protocols the app serves, each made on the pipeline: a new one is its module and a line here.
PROTOCOLS: tuple[Callable[[Pipeline], Any], ...] = (OpenAi, Responses, Messages, Rerank, Slots)


def _service(pipeline: Pipeline) -> Api:
    """``/health`` and ``/metrics`` (Prometheus), with OpenAI's error objects."""

    async def health(http: HttpRequest) -> Response:
        if pipeline.engine.closed:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(http: HttpRequest) -> Response:
        return Response(generate_latest(pipeline.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Api([("GET", HEALTH, health), ("GET", "/metrics", metrics)])


def _routes(apis: Sequence[Api]) -> list[tuple[Route, Api]]:
    """Every route of ``apis``, under each of its API's prefixes, with its API."""
    return [
        (Route(prefix + path, handler, methods=[method]), api)
        for api in apis
        for prefix in api.prefixes
        for method, path, handler in api.routes
    ]


class _Protocols:
    """Which API a request reached: that of the route it matches (its path, whatever the
    method), else that whose namespace holds its path, else the first (OpenAI's)."""

    def __init__(self, routes: list[tuple[Route, Api]]) -> None:
        self.routes = routes

    def of(self, scope: Scope) -> Api:
        path = _route_path(scope)
        routed = {**scope, "path": path, "root_path": ""}
        for route, api in self.routes:
            if route.matches(routed)[0] != Match.NONE:
                return api
        for _, api in self.routes:
            if api.namespace is not None and path.startswith(f"{api.namespace}/"):
                return api
        return self.routes[0][1]

    def error(self, error: ApiError, scope: Scope) -> JSONResponse:
        body = self.of(scope).error_body(error)
        return JSONResponse(body, status_code=error.status, headers=error.headers())


class _Guard:
    """ASGI middleware: the API key (except for ``/health``), in the headers the request's API
    takes it in, and the request's metrics, by route: the fixed paths of the routes, any other
    as "other" (a bounded set of labels)."""

    def __init__(self, app: ASGIApp, pipeline: Pipeline, protocols: _Protocols) -> None:
        self.app = app
        self.pipeline = pipeline
        self.protocols = protocols
        self.names = frozenset(route.path for route, _ in protocols.routes if not route.param_convertors)

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
            api = self.protocols.of(scope)
            if route != HEALTH and not self._authorized(scope, api):
                forms = (KEY_HEADERS[name] for name in api.key_headers)
                how = " or ".join(f"{shown}: {value.format('KEY')}" for value, shown in forms)
                error = ApiError(401, f"a valid API key is required ({how})", code="invalid_api_key")
                await self.protocols.error(error, scope)(scope, receive, tracked)
            else:
                await self.app(scope, receive, tracked)
        finally:
            metrics = self.pipeline.metrics
            metrics.requests.labels(route, str(status or CLIENT_GONE)).inc()
            metrics.duration.labels(route).observe(time.perf_counter() - started)

    def _authorized(self, scope: Scope, api: Api) -> bool:
        key = self.pipeline.api_key
        if key is None:
            return True
        accepted = {name.encode(): KEY_HEADERS[name][0].format(key).encode() for name in api.key_headers}
        return any(hmac.compare_digest(value, accepted[name]) for name, value in scope["headers"] if name in accepted)


def _route_path(scope: Scope) -> str:
    return str(scope["path"]).removeprefix(scope.get("root_path", ""))  # as mounted in another app


def _error_handlers(
    protocols: _Protocols,
) -> dict[Any, Callable[[HttpRequest, Exception], Awaitable[Response]]]:
    """Every failure as the error object of the API whose route it reached."""

    async def api_error(http: HttpRequest, error: Exception) -> Response:
        assert isinstance(error, ApiError)
        return protocols.error(error, http.scope)

    async def http_error(http: HttpRequest, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        if error.status_code == 404:
            return protocols.error(
                ApiError(404, f"no route {http.method} {http.url.path}", code="not_found"), http.scope
            )
        return protocols.error(ApiError(error.status_code, str(error.detail)), http.scope)

    async def unexpected(http: HttpRequest, error: Exception) -> Response:
        logger.exception("unexpected failure in %s %s", http.method, http.url.path)
        return protocols.error(ApiError(500, f"internal error: {type(error).__name__}"), http.scope)

    return {ApiError: api_error, HTTPException: http_error, Exception: unexpected}


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
    slot_files: SlotFiles | None = None,
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
    ``x-api-key: KEY``) everywhere but ``/health``; ``embeddings``, a context made with
    ``embeddings=True``, serves ``/v1/embeddings``, or, pooled by RANK (a reranker's),
    ``/v1/rerank`` (llama-server's, also ``/rerank``, ``/reranking`` and ``/v1/reranking``; 501
    without such a context); bodies over ``max_body_bytes`` get 413. Chats' ``http(s)://`` image URLs
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
    ``slot_files`` (``SlotFiles``) serves llama-server's ``POST /slots/{id}?action=save|restore``
    with files in its directory (``action=erase`` needs none; the others answer 501 without it).
    The app does not
    own the engine:
    close it when the app is done. Mount it in another Starlette or FastAPI app as any ASGI app.
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    if media_urls is not None and (engine.mtmd is None or not engine.mtmd.supports_vision()):
        raise ValueError("media_urls fetches images: the engine needs a projector that reads images (mtmd)")
    pipeline = Pipeline(
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
        slot_files,
    )
    routes = _routes([*(protocol(pipeline).api() for protocol in PROTOCOLS), _service(pipeline)])
    protocols = _Protocols(routes)
    app = Starlette(routes=[route for route, _ in routes], exception_handlers=_error_handlers(protocols))
    app.add_middleware(_Guard, pipeline=pipeline, protocols=protocols)
    return app


def _default_model_id(engine: Engine) -> str:
    """The model's file name without ``.gguf``, as llama-server names it."""
    return Path(engine.model.path).name.removesuffix(".gguf")
