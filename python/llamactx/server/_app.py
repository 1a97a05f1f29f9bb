"""The ASGI application: OpenAI's routes on an ``Engine``. Every request is validated before it
reaches the engine, every failure leaves as OpenAI's error object with its status, and a client
that goes away cancels what it asked for."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from llamactx import __version__
from llamactx._constraints import constraint_stage
from llamactx._embedding import embed
from llamactx._engine import Delta, Engine, Request
from llamactx._limits import INT32_MAX, RANDOM_SEED
from llamactx._llamactx import (
    Completion,
    EngineBusy,
    LlamaContext,
    LlamaCppError,
    LlamaSampler,
    SamplerInitError,
    SamplingParams,
    SchemaError,
)
from llamactx._render import PreparedChat
from llamactx.server._metrics import ServerMetrics
from llamactx.server._openai import JSON, ApiError, chat_logprobs, completion_logprobs, total_usage
from llamactx.server._schemas import PENALTY_WINDOW_MAX, ChatRequest, CompletionRequest, EmbeddingRequest, SamplingBody

__all__ = ["create_app"]

logger = logging.getLogger("llamactx.server")

#: Bodies larger than this are refused with 413 before they are read whole.
DEFAULT_MAX_BODY_BYTES = 4 * 2**20
#: Seconds a client is told to wait when the engine's queue is full.
RETRY_AFTER_SECONDS = 1
#: The most choices one request may ask for (prompts times ``n``), as OpenAI bounds ``n``: each is
#: an engine request holding a sequence's worth of work.
MAX_CHOICES = 128
#: A request with no ``max_tokens`` may fill its sequence (it then ends with "length").
UNLIMITED = INT32_MAX
SYSTEM_FINGERPRINT = f"llamactx-{__version__}"
#: Not an HTTP status a client sees: the client left before the response (nginx's number).
CLIENT_GONE = 499

Body = TypeVar("Body", bound=BaseModel)


@dataclass
class _Job:
    """One choice of a response: its engine request, and whether its prompt counts in usage."""

    request: Request
    index: int
    first_of_prompt: bool


class _Responses:
    """The route handlers, sharing the engine, the options and the metrics."""

    def __init__(
        self,
        engine: Engine,
        model_id: str,
        api_key: str | None,
        embeddings: LlamaContext | None,
        max_body_bytes: int,
    ) -> None:
        self.engine = engine
        self.model = engine.model
        self.n_vocab = engine.model.n_vocab()
        self.model_id = model_id
        self.api_key = api_key
        self.embeddings = embeddings
        self.embeddings_lock = threading.Lock()
        self.max_body_bytes = max_body_bytes
        self.metrics = ServerMetrics(engine)
        self.created = int(time.time())

    async def body(self, http: HttpRequest, schema: type[Body]) -> Body:
        declared = http.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise ApiError(413, f"the body has {declared} bytes; this server takes at most {self.max_body_bytes}")
        chunks, size = [], 0
        async for chunk in http.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise ApiError(413, f"the body is larger than this server takes ({self.max_body_bytes} bytes)")
            chunks.append(chunk)
        try:
            body = schema.model_validate_json(b"".join(chunks))
        except ValidationError as error:
            raise _invalid(error) from None
        model = getattr(body, "model", self.model_id)
        if model != self.model_id:
            raise ApiError(
                404,
                f"the model {model!r} does not exist; this server has {self.model_id!r}",
                param="model",
                code="model_not_found",
            )
        return body

    def sampling(self, body: SamplingBody, choice: int) -> SamplingParams:
        """The engine's sampling for choice ``choice``: the ``n`` choices draw with successive
        seeds, so that they differ and a seeded request repeats; seed -1 (mod 2**32) is random,
        as in llama.cpp, and so is no seed. ``repeat_last_n`` -1 is the whole sequence."""
        logit_bias: dict[int, float] = {}
        for key, value in (body.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()) or int(key) >= self.n_vocab:
                raise ApiError(
                    400, f"logit_bias keys are token ids below {self.n_vocab}, got {key!r}", param="logit_bias"
                )
            logit_bias[int(key)] = value
        return SamplingParams(
            temperature=body.temperature,
            top_k=body.top_k,
            top_p=body.top_p,
            min_p=body.min_p,
            typical_p=body.typical_p,
            repeat_penalty=body.repeat_penalty,
            frequency_penalty=body.frequency_penalty,
            presence_penalty=body.presence_penalty,
            penalty_last_n=min(self.engine.n_ctx_seq, PENALTY_WINDOW_MAX)
            if body.repeat_last_n == -1
            else body.repeat_last_n,
            logit_bias=logit_bias,
            seed=_seed(body.seed, choice),
        )

    def submit(
        self,
        prompts: Sequence[list[int]],
        body: SamplingBody,
        *,
        max_tokens: int,
        logprobs: int,
        schema: dict[str, Any] | None,
        schema_param: str = "response_format",
        sampler: LlamaSampler | None = None,
        stops: Sequence[str] = (),
    ) -> list[_Job]:
        """Queues every choice (all or none: a refusal cancels those already queued), its output
        constrained to ``schema`` (from the body's ``schema_param``) or ``sampler`` (a chat
        template's tool-call grammar) when given. The constraint is compiled once, and each
        choice takes a copy. Blocking work: call it off the event loop."""
        if len(prompts) * body.n > MAX_CHOICES:
            raise ApiError(
                400,
                f"the request asks for {len(prompts)} prompt(s) times n={body.n} choices; this server takes at most "
                f"{MAX_CHOICES}",
                param="n",
            )
        limit = self.engine.n_ctx_seq
        for tokens in prompts:
            if len(tokens) >= limit:
                raise ApiError(
                    400,
                    f"the prompt has {len(tokens)} tokens; a request of this server holds at most {limit} "
                    "(prompt and completion)",
                    code="context_length_exceeded",
                )
        stop = [body.stop] if isinstance(body.stop, str) else (body.stop or [])
        stop = [*stop, *stops]
        jobs: list[_Job] = []
        try:
            if sampler is None:
                sampler = constraint_stage(self.model, schema, body.grammar)
            for tokens in prompts:
                for choice in range(body.n):
                    request = self.engine.submit(
                        tokens,
                        max_tokens=max_tokens,
                        stop=stop,
                        sampling=self.sampling(body, choice),
                        logprobs=logprobs,
                        grammar=sampler,
                    )
                    jobs.append(_Job(request, len(jobs), choice == 0))
        except BaseException as error:
            for job in jobs:
                job.request.cancel()
            if isinstance(error, Exception):
                if self.engine.closed:
                    raise ApiError(503, "the server is shutting down", retry_after=RETRY_AFTER_SECONDS) from error
                if isinstance(error, SchemaError):
                    param = "grammar" if body.grammar is not None else schema_param
                    raise ApiError(400, f"the constraint cannot be used: {error}", param=param) from error
                if (refusal := _refusal(error)) is not None:
                    raise refusal from error
            raise
        return jobs

    async def list_models(self, http: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def get_model(self, http: HttpRequest) -> Response:
        if http.path_params["model"] != self.model_id:
            raise ApiError(404, f"the model {http.path_params['model']!r} does not exist", code="model_not_found")
        return JSONResponse(self._model_card())

    def _model_card(self) -> JSON:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "llamactx"}

    async def health(self, http: HttpRequest) -> Response:
        if self.engine.closed:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics_text(self, http: HttpRequest) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def completions(self, http: HttpRequest) -> Response:
        body = await self.body(http, CompletionRequest)
        if body.best_of not in (None, body.n):
            raise ApiError(400, "best_of must equal n (choices are not ranked)", param="best_of")
        top = body.logprobs or 0
        schema = _response_schema(body)

        def prepare() -> list[_Job]:
            return self.submit(
                self._completion_prompts(body),
                body,
                max_tokens=UNLIMITED if body.max_tokens is None else body.max_tokens,
                logprobs=_engine_logprobs(body.logprobs is not None, top),
                schema=schema,
            )

        # Tokenizing and compiling constraints take time the event loop cannot give.
        jobs = await asyncio.to_thread(prepare)
        reply = _Reply("cmpl", "text_completion", self.model_id, body.stream_options)

        def choice(job: _Job, delta: Delta | None, completion: Completion | None, offset: int) -> JSON:
            out: JSON = {"index": job.index, "text": "", "logprobs": None, "finish_reason": None}
            if completion is not None:
                out["finish_reason"] = completion.finish_reason
                if body.stream:  # the text went out in earlier chunks
                    return out
                delta = (completion.text, completion.logprobs)
            if delta is not None:
                out["text"], logprobs = delta
                if body.logprobs is not None:
                    out["logprobs"] = completion_logprobs(self.model, logprobs, top, offset)
            return out

        return await self._respond(http, reply, jobs, body.stream, choice)

    def _completion_prompts(self, body: CompletionRequest) -> list[list[int]]:
        prompt = body.prompt
        texts_or_ids: list[str] | list[list[int]]
        if isinstance(prompt, str):
            texts_or_ids = [prompt]
        elif prompt and isinstance(prompt[0], int):
            texts_or_ids = [[int(token) for token in prompt]]
        else:
            texts_or_ids = prompt  # type: ignore[assignment]  # the two list kinds left
        if not texts_or_ids:
            raise ApiError(400, "prompt is an empty list", param="prompt")
        return [self._tokens(partial(self.engine.tokens, one), "prompt") for one in texts_or_ids]

    async def chat(self, http: HttpRequest) -> Response:
        body = await self.body(http, ChatRequest)
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        requested = _response_schema(body)
        limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        top = body.top_logprobs or 0

        def prepare() -> tuple[PreparedChat, list[_Job]]:
            chat = self._prepared_chat(body)
            if chat.with_tools and (body.grammar is not None or requested is not None):
                raise ApiError(
                    400, "tools constrain the reply themselves: drop grammar and response_format", param="tools"
                )
            jobs = self.submit(
                [chat.tokens],
                body,
                max_tokens=UNLIMITED if limit is None else limit,
                logprobs=_engine_logprobs(body.logprobs, top),
                schema=chat.json_schema or requested,
                schema_param="tools" if chat.with_tools else "response_format",
                sampler=chat.sampler,
                stops=chat.stops,
            )
            return chat, jobs

        # Rendering the template and compiling constraints take time the event loop cannot give.
        chat, jobs = await asyncio.to_thread(prepare)
        reply = _Reply("chatcmpl", "chat.completion", self.model_id, body.stream_options)

        def choice(job: _Job, delta: Delta | None, completion: Completion | None, offset: int) -> JSON | None:
            logprobs_wanted = body.logprobs
            if completion is None:
                out: JSON = {
                    "index": job.index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                if delta is not None:
                    if chat.with_tools:
                        return None  # a call is only known whole: the message comes at the end
                    text, logprobs = delta
                    out["delta"] = {"content": text}
                    if logprobs_wanted:
                        out["logprobs"] = chat_logprobs(self.model, logprobs, top)
                return out
            message = {**chat.reply(completion.text), "refusal": None}
            finish = "tool_calls" if message.get("tool_calls") and completion.finish_reason == "stop" else None
            out = {"index": job.index, "logprobs": None, "finish_reason": finish or completion.finish_reason}
            if body.stream:
                out["delta"] = {}
                if chat.with_tools:
                    out["delta"] = _streamed(message)
            else:
                out["message"] = message
                if logprobs_wanted:
                    out["logprobs"] = chat_logprobs(self.model, completion.logprobs, top)
            return out

        return await self._respond(http, reply, jobs, body.stream, choice)

    def _prepared_chat(self, body: ChatRequest) -> PreparedChat:
        """The chat's prompt tokens, the reply's constraint when ``tools`` may be called, and its
        parser (see ``Engine.prepare_chat``)."""
        messages = [message.model_dump(exclude_none=True) for message in body.messages]
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools or ()]
        choice = body.tool_choice or "auto"
        named = choice if isinstance(choice, str) else choice.model_dump()
        try:
            return self.engine.prepare_chat(
                messages, tools=tools, tool_choice=named, parallel_tool_calls=body.parallel_tool_calls
            )
        except (LlamaCppError, ValueError) as error:
            param = "tool_choice" if "tool_choice" in str(error) else ("tools" if tools else "messages")
            raise ApiError(400, f"the {param} cannot be used: {error}", param=param) from None

    def _tokens(self, tokenize: Callable[[], list[int]], param: str) -> list[int]:
        try:
            return tokenize()
        except (LlamaCppError, ValueError) as error:
            raise ApiError(400, f"the {param} cannot be read: {error}", param=param) from None

    async def embeddings_route(self, http: HttpRequest) -> Response:
        body = await self.body(http, EmbeddingRequest)
        if self.embeddings is None:
            raise ApiError(404, "this server computes no embeddings: start it with --embeddings", code="not_found")
        n_embd = self.model.n_embd()
        if body.dimensions not in (None, n_embd):
            raise ApiError(400, f"this model's embeddings have {n_embd} dimensions", param="dimensions")
        texts = [body.input] if isinstance(body.input, str) else body.input
        try:
            vectors, used = await asyncio.to_thread(self._embed, texts)
        except (LlamaCppError, ValueError) as error:
            raise ApiError(400, f"the input cannot be embedded: {error}", param="input") from None
        data = [
            {"object": "embedding", "index": index, "embedding": _encoded(vector, body.encoding_format)}
            for index, vector in enumerate(vectors)
        ]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": self.model_id,
                "usage": {"prompt_tokens": used, "total_tokens": used},
            }
        )

    def _embed(self, texts: list[str]) -> tuple[np.ndarray[Any, np.dtype[np.float32]], int]:
        assert self.embeddings is not None
        with self.embeddings_lock:  # embed() uses the whole context
            vectors = embed(self.embeddings, texts)
        return vectors, sum(len(self.model.str_to_token(text, True)) for text in texts)

    async def _respond(
        self, http: HttpRequest, reply: _Reply, jobs: list[_Job], stream: bool, choice: _ChoiceBuilder
    ) -> Response:
        if stream:
            return StreamingResponse(
                self._events(reply, jobs, choice),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Request-Id": reply.id},
            )
        try:
            completions = await _unless_disconnected(http, [job.request for job in jobs])
        except LlamaCppError as error:
            raise _failure(error) from None
        if completions is None:
            return Response(status_code=CLIENT_GONE)
        self._finished(reply, jobs, completions)
        built = (choice(job, None, completion, 0) for job, completion in zip(jobs, completions, strict=True))
        choices = [one for one in built if one is not None]
        usage = total_usage(_firsts(jobs, completions), completions)
        return JSONResponse(reply.whole(choices, usage), headers={"X-Request-Id": reply.id})

    async def _events(self, reply: _Reply, jobs: list[_Job], choice: _ChoiceBuilder) -> AsyncIterator[str]:
        """Server-sent events: a first chunk per choice, its text as generated, its end; then
        the usage if asked for, then ``[DONE]``. Leaving early (the client went away) cancels
        every choice."""
        try:
            if reply.object == "chat.completion":
                for job in jobs:
                    if (first := choice(job, None, None, 0)) is not None:
                        yield reply.event([first])
            offsets = [0] * len(jobs)
            async for index, delta in _merged(jobs):
                if (chunk := choice(jobs[index], delta, None, offsets[index])) is not None:
                    yield reply.event([chunk])
                offsets[index] += len(delta[0])
            completions = [await job.request for job in jobs]
            self._finished(reply, jobs, completions)
            for job, completion in zip(jobs, completions, strict=True):
                if (last := choice(job, None, completion, offsets[job.index])) is not None:
                    yield reply.event([last])
            if reply.include_usage:
                yield reply.event([], usage=total_usage(_firsts(jobs, completions), completions))
            yield "data: [DONE]\n\n"
        except ApiError as error:
            yield f"data: {_dumps(error.body())}\n\n"
        except LlamaCppError as error:
            yield f"data: {_dumps(_failure(error).body())}\n\n"
        finally:
            for job in jobs:
                job.request.cancel()

    def _finished(self, reply: _Reply, jobs: list[_Job], completions: list[Completion]) -> None:
        """Counts and logs a response whose choices all ended; a choice the engine cancelled
        (it was closed) fails the response."""
        for job, completion in zip(jobs, completions, strict=True):
            self.metrics.record(completion, prompt_counted=job.first_of_prompt)
        if any(completion.finish_reason == "cancelled" for completion in completions):
            raise ApiError(503, "the server is shutting down", retry_after=RETRY_AFTER_SECONDS)
        first = completions[0]
        generated = sum(c.completion_tokens for c in completions)
        logger.info(
            "%s done: %d choice(s), prompt %d tokens (%d cached), completion %d tokens, queued %.3f s, "
            "first token after %.3f s, %.1f tokens/s",
            reply.id,
            len(completions),
            first.prompt_tokens,
            first.cached_tokens,
            generated,
            first.queue_seconds,
            first.first_token_seconds or 0.0,
            first.tokens_per_second,
            extra={
                "request_id": reply.id,
                "prompt_tokens": first.prompt_tokens,
                "cached_tokens": first.cached_tokens,
                "completion_tokens": generated,
                "queue_seconds": first.queue_seconds,
                "first_token_seconds": first.first_token_seconds,
            },
        )


# A choice's chunk or whole choice; None: nothing to send for this delta.
_ChoiceBuilder = Callable[[_Job, Delta | None, Completion | None, int], JSON | None]


class _Reply:
    """The envelope of one response: its id, object type and creation time."""

    def __init__(self, prefix: str, object_type: str, model_id: str, stream_options: Any) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.object = object_type
        self.chunk_object = "chat.completion.chunk" if object_type == "chat.completion" else object_type
        self.model_id = model_id
        self.created = int(time.time())
        self.include_usage = bool(stream_options and stream_options.include_usage)

    def _envelope(self, object_type: str, choices: list[JSON]) -> JSON:
        return {
            "id": self.id,
            "object": object_type,
            "created": self.created,
            "model": self.model_id,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        }

    def whole(self, choices: list[JSON], usage: JSON) -> JSON:
        return {**self._envelope(self.object, choices), "usage": usage}

    def event(self, choices: list[JSON], usage: JSON | None = None) -> str:
        chunk = self._envelope(self.chunk_object, choices)
        if self.include_usage:
            chunk["usage"] = usage
        return f"data: {_dumps(chunk)}\n\n"


def _dumps(value: JSON) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _firsts(jobs: list[_Job], completions: list[Completion]) -> list[Completion]:
    return [completion for job, completion in zip(jobs, completions, strict=True) if job.first_of_prompt]


def _engine_logprobs(wanted: bool, top: int) -> int:
    """What the engine must collect: the chosen token's log-probability needs one alternative
    asked for even when the client wants none (``top_logprobs: 0``)."""
    return max(top, 1) if wanted else 0


def _seed(seed: int | None, choice: int) -> int | None:
    if seed is None or (seed := (seed + choice) % 2**32) == RANDOM_SEED:
        return None
    return seed


def _encoded(vector: np.ndarray[Any, np.dtype[np.float32]], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(value) for value in vector]


async def _merged(jobs: list[_Job]) -> AsyncIterator[tuple[int, Delta]]:
    """The deltas of all ``jobs`` as they come, tagged with the job's index."""
    if len(jobs) == 1:
        async for delta in jobs[0].request.adeltas():
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, Delta] | int | Exception] = asyncio.Queue()

    async def pump(job: _Job) -> None:
        try:
            async for delta in job.request.adeltas():
                queue.put_nowait((job.index, delta))
            queue.put_nowait(job.index)  # its end
        except Exception as error:  # handed to the reader, who raises it
            queue.put_nowait(error)

    tasks = [asyncio.ensure_future(pump(job)) for job in jobs]
    try:
        running = len(jobs)
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


async def _unless_disconnected(http: HttpRequest, requests: list[Request]) -> list[Completion] | None:
    """The requests' completions, or None (and the requests cancelled) if the client leaves
    first."""

    async def client_left() -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass

    results = asyncio.ensure_future(_gather(requests))
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


async def _gather(requests: list[Request]) -> list[Completion]:
    return [await request for request in requests]


_TYPE_NAMES = frozenset(["str", "int", "float", "bool", "list", "dict"])


def _invalid(error: ValidationError) -> ApiError:
    """The first problem pydantic found, as OpenAI words it: the parameter and what is wrong."""
    problem = error.errors(include_url=False)[0]
    # Without the union members pydantic names ("str", "list[TextPart]"): the client's path.
    path = [str(part) for part in problem["loc"] if isinstance(part, int) or part.isidentifier()]
    param = ".".join(part for part in path if part not in _TYPE_NAMES) or None
    if problem["type"] == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {problem['msg']}")
    if problem["type"] == "model_type":
        return ApiError(400, "the body must be a JSON object")
    if problem["type"] == "extra_forbidden":
        return ApiError(400, f"unknown or unsupported parameter: {param}", param=param)
    if problem["type"] == "missing":
        return ApiError(400, f"missing required parameter: {param}", param=param)
    return ApiError(400, f"invalid value for {param}: {problem['msg']}", param=param)


def _streamed(message: JSON) -> JSON:
    """A whole reply as the last streamed delta: content, or the tool calls with their index."""
    calls = message.get("tool_calls")
    if not calls:
        return {"content": message["content"]}
    return {"tool_calls": [{"index": index, **call} for index, call in enumerate(calls)]}


def _response_schema(body: SamplingBody) -> dict[str, Any] | None:
    """The JSON Schema ``response_format`` asks for (None: any text)."""
    if body.response_format is None:
        return None
    if body.response_format.type == "json_schema" and body.response_format.json_schema is None:
        raise ApiError(400, "response_format json_schema needs its json_schema", param="response_format.json_schema")
    if body.grammar is not None and body.response_format.type != "text":
        raise ApiError(400, "give grammar or a JSON response_format, not both", param="response_format")
    return body.response_format.output_schema()


def _refusal(error: Exception) -> ApiError | None:
    """What the client sees of the engine's refusal to take a request (None: not a refusal)."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, EngineBusy):
        return ApiError(503, f"the server is busy: {error}", code="server_busy", retry_after=RETRY_AFTER_SECONDS)
    if isinstance(error, SamplerInitError):
        return ApiError(400, f"the grammar cannot be used: {error}", param="grammar")

    if isinstance(error, (ValueError, LlamaCppError)):
        return ApiError(400, str(error))
    return None


def _failure(error: LlamaCppError) -> ApiError:
    """What a client sees of a request that failed inside the engine: a constraint that its
    parser's limits stopped while generating is the request's own (400), anything else 500."""
    if isinstance(error, SchemaError):
        return ApiError(400, f"the constraint failed while generating: {error}")
    return ApiError(500, f"the request failed: {type(error).__name__}: {error}")


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


async def _api_error(http: HttpRequest, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return _error_response(error)


async def _http_error(http: HttpRequest, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    if error.status_code == 404:
        return _error_response(ApiError(404, f"no route {http.method} {http.url.path}", code="not_found"))
    return _error_response(ApiError(error.status_code, str(error.detail)))


async def _unexpected(http: HttpRequest, error: Exception) -> Response:
    logger.exception("unexpected failure in %s %s", http.method, http.url.path)
    return _error_response(ApiError(500, f"internal error: {type(error).__name__}"))


class _Guard:
    """ASGI middleware: the API key (except for ``/health``), and the request's metrics."""

    def __init__(self, app: ASGIApp, responses: _Responses) -> None:
        self.app = app
        self.responses = responses

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))  # as mounted in another app
        route = path if path in _ROUTE_NAMES else "other"
        started = time.perf_counter()
        status = 0

        async def tracked(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if route != "/health" and not self._authorized(scope):
                error = ApiError(401, "a valid API key is required (Authorization: Bearer KEY)", code="invalid_api_key")
                await _error_response(error)(scope, receive, tracked)
            else:
                await self.app(scope, receive, tracked)
        finally:
            metrics = self.responses.metrics
            metrics.requests.labels(route, str(status or CLIENT_GONE)).inc()
            metrics.duration.labels(route).observe(time.perf_counter() - started)

    def _authorized(self, scope: Scope) -> bool:
        key = self.responses.api_key
        if key is None:
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, b"Bearer " + key.encode())
        return False


_ROUTE_NAMES = frozenset(
    ["/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings"]
)


def create_app(
    engine: Engine,
    *,
    model_id: str | None = None,
    api_key: str | None = None,
    embeddings: LlamaContext | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Starlette:
    """An ASGI application serving OpenAI's API with ``engine``: ``/v1/models``,
    ``/v1/completions``, ``/v1/chat/completions`` (streamed as server-sent events or not),
    ``/v1/embeddings``, ``/health`` and ``/metrics`` (Prometheus).

    ``model_id`` is the name clients pass as ``model`` (default: the model's file name, without
    ``.gguf``);
    ``api_key``, when set, is required as ``Authorization: Bearer KEY`` everywhere but
    ``/health``; ``embeddings``, a context made with ``embeddings=True``, serves
    ``/v1/embeddings``; bodies over ``max_body_bytes`` get 413. The app does not own the engine:
    close it when the app is done. Mount it in another Starlette or FastAPI app as any ASGI app.
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    responses = _Responses(engine, model_id or _default_model_id(engine), api_key, embeddings, max_body_bytes)
    routes = [
        Route("/health", responses.health, methods=["GET"]),
        Route("/metrics", responses.metrics_text, methods=["GET"]),
        Route("/v1/models", responses.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", responses.get_model, methods=["GET"]),
        Route("/v1/completions", responses.completions, methods=["POST"]),
        Route("/v1/chat/completions", responses.chat, methods=["POST"]),
        Route("/v1/embeddings", responses.embeddings_route, methods=["POST"]),
    ]
    handlers: dict[Any, Callable[[HttpRequest, Exception], Awaitable[Response]]] = {
        ApiError: _api_error,
        HTTPException: _http_error,
        Exception: _unexpected,
    }
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.add_middleware(_Guard, responses=responses)
    return app


def _default_model_id(engine: Engine) -> str:
    """The model's file name without ``.gguf``, as llama-server names it."""
    return Path(engine.model.path).name.removesuffix(".gguf")
