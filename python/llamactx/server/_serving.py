"""Serving OpenAI's requests with an ``Engine``: a parsed body becomes engine requests (one per
choice, all submitted or none), their results become OpenAI's objects, whole or streamed, and a
client that goes away cancels what it asked for. Every exception reaches the client through one
table, ``ERRORS``."""

from __future__ import annotations

import asyncio
import base64
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from llamactx._constraints import constraint_stage
from llamactx._embedding import embed, input_tokens
from llamactx._engine import Delta, Engine, Request
from llamactx._limits import INT32_MAX, RANDOM_SEED
from llamactx._llamactx import (
    ChatTemplateError,
    Completion,
    EngineBusy,
    LlamaContext,
    LlamaCppError,
    SamplerInitError,
    SamplingParams,
    SchemaError,
    StringToTokenError,
)
from llamactx._media import MediaBudget
from llamactx._reasoning import Reasoning, ReplyStream
from llamactx._render import Message, PreparedChat
from llamactx._sampling import SAMPLING_DEFAULTS
from llamactx._schema_check import OutputCheck
from llamactx._tools import Tool, ToolChoice
from llamactx.server._media_urls import MediaUrls, refuse_media_urls
from llamactx.server._metrics import ServerMetrics
from llamactx.server._protocol import (
    PENALTY_WINDOW_MAX,
    ApiError,
    Body,
    ChatChoice,
    ChatChunkChoice,
    ChatRequest,
    Choice,
    CompletionChoice,
    CompletionRequest,
    ContextLengthExceeded,
    EmbeddingList,
    EmbeddingRequest,
    Envelope,
    ModelCard,
    SamplingBody,
    chat_logprobs,
    completion_logprobs,
    event,
    parsed,
    total_usage,
)

__all__ = ["CLIENT_GONE", "ERRORS", "Serving", "event_stream", "openai_error"]

logger = logging.getLogger("llamactx.server")

#: Seconds a client is told to wait when the engine's queue is full or it is shutting down.
RETRY_AFTER_SECONDS = 1
#: A request with no ``max_tokens`` may fill its sequence (it then ends with "length").
UNLIMITED = INT32_MAX
#: Not an HTTP status a client sees: the client left before the response (nginx's number).
CLIENT_GONE = 499

Prompt = TypeVar("Prompt", list[int], PreparedChat)


@dataclass(frozen=True)
class Outcome:
    """What a client sees of an exception: the status (OpenAI's error ``type`` follows from it),
    OpenAI's ``code``, and the seconds of ``Retry-After``."""

    status: int
    code: str | None = None
    retry_after: int = 0


#: Exceptions raised by the engine, as the client sees them: the first row whose type matches.
#: A 400 is the request's own fault (a value the engine refuses, a constraint that cannot be
#: compiled or that failed while generating: ``SchemaError`` is a ``ValueError``); it names the
#: parameter the exception carries (``param``) or else the one the failing step was given. An
#: exception of no row is a bug: the app logs it and answers 500.
ERRORS: tuple[tuple[type[Exception], Outcome], ...] = (
    (EngineBusy, Outcome(503, "server_busy", RETRY_AFTER_SECONDS)),
    (SamplerInitError, Outcome(400)),
    (ChatTemplateError, Outcome(400)),  # rendering passed the work limit
    (StringToTokenError, Outcome(400)),
    (ValueError, Outcome(400)),
    (LlamaCppError, Outcome(500)),
)


def openai_error(error: Exception, doing: str, param: str | None = None) -> Exception:
    """``error`` as the client sees it (``ERRORS``) while ``doing`` (what failed, for the
    message) on ``param``; ``error`` itself when no row matches."""
    if isinstance(error, ApiError):
        return error
    for kind, outcome in ERRORS:
        if isinstance(error, kind):
            named = (getattr(error, "param", None) or param) if outcome.status == 400 else None
            detail = f"{type(error).__name__}: {error}" if outcome.status == 500 else str(error)
            return ApiError(
                outcome.status, f"{doing}: {detail}", param=named, code=outcome.code, retry_after=outcome.retry_after
            )
    return error


def _shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", retry_after=RETRY_AFTER_SECONDS)


@dataclass
class _Generation:
    """One choice of a response: its engine request, whether its prompt counts in usage, and the
    check of its JSON Schema's finished value, with the parameter that gave the schema."""

    request: Request
    index: int
    first_of_prompt: bool
    check: OutputCheck | None = None
    schema_param: str | None = None


class _Identified(Protocol):
    """A response as its log line names it."""

    @property
    def id(self) -> str: ...


class _Choices(Protocol):
    """How one endpoint shows its choices: whole, or as the chunks of a stream (None: no chunk)."""

    def opening(self, generation: _Generation) -> Choice | None: ...

    def piece(self, generation: _Generation, delta: Delta, offset: int) -> Choice | None: ...

    def closing(self, generation: _Generation, completion: Completion) -> Choice: ...

    def whole(self, generation: _Generation, completion: Completion) -> Choice: ...


class Serving:
    """The endpoints' handlers, sharing the engine, the options and the metrics."""

    def __init__(
        self,
        engine: Engine,
        model_id: str,
        model_aliases: Sequence[str],
        strict_model: bool,
        api_key: str | None,
        embeddings: LlamaContext | None,
        max_body_bytes: int,
        media_urls: MediaUrls | None = None,
        media_budget: MediaBudget = MediaBudget(),
        chat_template_kwargs: Mapping[str, Any] | None = None,
        reasoning: Reasoning = Reasoning(),
    ) -> None:
        self.engine = engine
        self.model = engine.model
        self.n_vocab = engine.model.n_vocab()
        self.model_id = model_id
        # The names /v1/models lists, in order, each once.
        self.model_names = tuple(dict.fromkeys([model_id, *model_aliases]))
        self.strict_model = strict_model
        self.api_key = api_key
        self.embeddings = embeddings
        self.embeddings_lock = threading.Lock()
        self.max_body_bytes = max_body_bytes
        self.media_urls = media_urls
        self.media_budget = media_budget
        # Every chat's template variables, which a request's own override.
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        # Every chat's reasoning, whose format a chat request may change.
        self.reasoning = reasoning
        self.metrics = ServerMetrics(engine)
        self.created = int(time.time())

    async def health(self, http: HttpRequest) -> Response:
        if self.engine.closed:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics_text(self, http: HttpRequest) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def list_models(self, http: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card(name) for name in self.model_names]})

    async def get_model(self, http: HttpRequest) -> Response:
        name = http.path_params["model"]
        if name not in self.model_names:
            raise ApiError(404, f"the model {name!r} does not exist", code="model_not_found")
        return JSONResponse(self._model_card(name))

    def _model_card(self, name: str) -> ModelCard:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "llamactx"}

    async def completions(self, http: HttpRequest) -> Response:
        body = await self._body(http, CompletionRequest)
        top = body.logprobs or 0

        def submit() -> list[_Generation]:
            prompts = [self._prompt_tokens(prompt) for prompt in body.prompts()]
            return self._submitted(
                body,
                prompts,
                self.engine.submit,
                max_tokens=UNLIMITED if body.max_tokens is None else body.max_tokens,
                logprobs=_engine_logprobs(body.logprobs is not None, top),
                constraint_param=_constraint_param(body),
            )

        # Tokenizing and compiling constraints take time the event loop cannot give.
        generations = await asyncio.to_thread(submit)
        envelope = Envelope("cmpl", "text_completion", self.model_id, body.stream_options)
        choices = _CompletionChoices(self, body.logprobs is not None, top)
        return await self._respond(http, envelope, generations, body.stream, choices)

    def _prompt_tokens(self, prompt: str | list[int]) -> list[int]:
        try:
            tokens = self.engine.tokens(prompt)
        except Exception as error:
            raise openai_error(error, "the prompt cannot be read", "prompt") from None
        if not tokens:
            raise ApiError(400, "the prompt has no tokens", param="prompt")
        self._check_fits(len(tokens))
        return tokens

    def _check_fits(self, n_tokens: int) -> None:
        """``ContextLengthExceeded`` unless a prompt of ``n_tokens`` (images included) fits a
        sequence: checked here, before the engine encodes any image or checks the length
        itself, for OpenAI's error code."""
        if n_tokens >= self.engine.n_ctx_seq:
            raise ContextLengthExceeded(n_tokens, self.engine.n_ctx_seq)

    async def chat(self, http: HttpRequest) -> Response:
        body = await self._body(http, ChatRequest)
        limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        top = body.top_logprobs or 0
        messages = await self._with_media_fetched([message.model_dump(exclude_none=True) for message in body.messages])

        def submit() -> tuple[PreparedChat, list[_Generation]]:
            chat = self._prepared_chat(body, messages)
            generations = self._submitted(
                body,
                [chat],
                self.engine.submit_prepared,
                max_tokens=UNLIMITED if limit is None else limit,
                logprobs=_engine_logprobs(body.logprobs, top),
                constraint_param="tools" if chat.with_tools else _constraint_param(body),
            )
            return chat, generations

        # Rendering the template and compiling constraints take time the event loop cannot give.
        chat, generations = await asyncio.to_thread(submit)
        envelope = Envelope("chatcmpl", "chat.completion", self.model_id, body.stream_options)
        return await self._respond(
            http, envelope, generations, body.stream, _ChatChoices(self, chat, body.logprobs, top)
        )

    async def _with_media_fetched(
        self, messages: list[dict[str, Any]], messages_param: str = "messages"
    ) -> list[dict[str, Any]]:
        """``messages``, their ``http(s)://`` image URLs fetched into ``data:`` URLs where the
        server was made to (``MediaUrlPolicy``), else refused with a 400 that says how to allow
        them (on a server that reads images at all; another refuses every image). The messages
        are ``messages_param`` of the body, which a 400 names."""
        try:
            if self.media_urls is not None:
                await self.media_urls.inline(messages)
            elif self.engine.mtmd is not None:
                refuse_media_urls(messages)
        except ApiError as failure:
            failure.param = messages_param
            raise
        return messages

    def _prepared_chat(self, body: ChatRequest, messages: list[dict[str, Any]]) -> PreparedChat:
        """The chat of ``body``, whose ``messages`` are given as dicts (``_rendered_chat``)."""
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools or ()]
        choice = body.tool_choice or "auto"
        named = choice if isinstance(choice, str) else choice.model_dump()
        kwargs = body.chat_template_kwargs
        return self._rendered_chat(
            messages,
            tools,
            named,
            body.parallel_tool_calls,
            template_kwargs=kwargs,
            reasoning_format=body.reasoning_format,
        )

    def _rendered_chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        tool_choice: ToolChoice,
        parallel_tool_calls: bool,
        messages_param: str = "messages",
        template_kwargs: dict[str, Any] | None = None,
        reasoning_budget: int | None = None,
        reasoning_format: str | None = None,
    ) -> PreparedChat:
        """The chat rendered once for all its choices (``Engine.prepare_chat``, which checks the
        messages and tools, and reads the media under the server's ``MediaBudget``: its errors
        name their parameter, or are the messages' or, for a tool-call constraint that cannot
        be compiled, the tools'), checked to fit a sequence, media included. The messages are
        ``messages_param`` of the body (the Responses API's ``input``); ``template_kwargs`` is
        chat's ``chat_template_kwargs`` (its errors name it), over the server's;
        ``reasoning_budget`` and ``reasoning_format`` replace the server's (``Reasoning``)."""
        reasoning = self.reasoning
        try:
            if reasoning_format is not None:
                reasoning = replace(reasoning, format=reasoning_format)
        except ValueError as error:
            raise ApiError(400, str(error), param="reasoning_format") from None
        if reasoning_budget is not None:
            reasoning = replace(reasoning, budget=reasoning_budget)  # the body's model checked it
        template_kwargs = {**self.chat_template_kwargs, **(template_kwargs or {})} or None
        try:
            chat = self.engine.prepare_chat(
                messages,
                tools=tools,
                tool_choice=tool_choice,
                parallel_tool_calls=parallel_tool_calls,
                media_budget=self.media_budget,
                chat_template_kwargs=template_kwargs,
                reasoning=reasoning,
            )
        except Exception as error:
            param = "tools" if isinstance(error, (SchemaError, SamplerInitError)) else messages_param
            if "chat_template_kwargs" in str(error):
                param = "chat_template_kwargs"
            failure = openai_error(error, "the chat cannot be rendered", param)
            if isinstance(failure, ApiError) and failure.param == "messages":
                failure.param = messages_param  # as the engine names them
            raise failure from None
        self._check_fits(chat.n_tokens)
        return chat

    def _submitted(
        self,
        body: SamplingBody,
        prompts: Sequence[Prompt],
        submit: Callable[..., Request],
        *,
        max_tokens: int,
        logprobs: int,
        constraint_param: str,
    ) -> list[_Generation]:
        """Submits ``body.n`` choices of each prompt with ``submit`` (``Engine.submit`` or
        ``submit_prepared``): all, or none (a refusal cancels those already queued). The body's
        constraint is compiled once, and each choice takes a copy. The prompts fit (``_check_fits``)
        and the numbers are in range (the body's model): what the engine can refuse is the
        constraint (named by ``constraint_param``), or the request when the queue is full. Blocking
        work: call it off the event loop."""
        generations: list[_Generation] = []
        try:
            stage, check = constraint_stage(self.model, body.output_schema(), body.grammar)
            for prompt in prompts:
                for choice in range(body.n):
                    request = submit(
                        prompt,
                        max_tokens=max_tokens,
                        stop=body.stops(),
                        sampling=self._sampling(body, choice),
                        logprobs=logprobs,
                        grammar=stage,
                    )
                    generations.append(_Generation(request, len(generations), choice == 0, check, constraint_param))
        except BaseException as error:
            for generation in generations:
                generation.request.cancel()
            if not isinstance(error, Exception):
                raise
            if self.engine.closed:
                raise _shutting_down() from error
            raise openai_error(error, "the request cannot be submitted", constraint_param) from error
        return generations

    def _sampling(self, body: SamplingBody, choice: int) -> SamplingParams:
        """The engine's sampling for choice ``choice``: the body's fields named as
        ``SamplingParams``' as they are; the ``n`` choices draw with successive seeds, so that
        they differ and a seeded request repeats; seed -1 (mod 2**32) is random, as in llama.cpp,
        and so is no seed. ``repeat_last_n`` -1 is the whole sequence."""
        given = {name: getattr(body, name) for name in SAMPLING_DEFAULTS if name in SamplingBody.model_fields}
        window = body.repeat_last_n
        given.update(
            penalty_last_n=min(self.engine.n_ctx_seq, PENALTY_WINDOW_MAX) if window == -1 else window,
            logit_bias={int(token): bias for token, bias in (body.logit_bias or {}).items()},
            seed=_seed(body.seed, choice),
        )
        return SamplingParams(**given)

    async def embeddings_route(self, http: HttpRequest) -> Response:
        body = await self._body(http, EmbeddingRequest)
        if self.embeddings is None:
            raise ApiError(404, "this server computes no embeddings: start it with --embeddings", code="not_found")
        n_embd = self.model.n_embd()
        if body.dimensions not in (None, n_embd):
            raise ApiError(400, f"this model's embeddings have {n_embd} dimensions", param="dimensions")
        given = [body.input] if isinstance(body.input, str) else body.input
        ids = [item for item in given if isinstance(item, int)]  # one input, as token ids
        inputs: list[str | list[int]] = [ids] if ids else [item for item in given if not isinstance(item, int)]
        try:
            vectors, used = await asyncio.to_thread(self._embed, inputs)
        except Exception as error:
            raise openai_error(error, "the input cannot be embedded", "input") from None
        answer: EmbeddingList = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": _encoded(vector, body.encoding_format)}
                for index, vector in enumerate(vectors)
            ],
            "model": self.model_id,
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }
        return JSONResponse(answer)

    def _embed(self, inputs: list[str | list[int]]) -> tuple[np.ndarray[Any, np.dtype[np.float32]], int]:
        assert self.embeddings is not None
        with self.embeddings_lock:  # embed() uses the whole context
            vectors = embed(self.embeddings, inputs)
        return vectors, sum(len(input_tokens(self.model, one)) for one in inputs)

    async def _body(self, http: HttpRequest, schema: type[Body]) -> Body:
        """The body, read up to ``max_body_bytes`` (413 past it), parsed and checked by
        ``schema``, for this server's model (``_check_model``)."""
        declared = http.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise ApiError(413, f"the body has {declared} bytes; this server takes at most {self.max_body_bytes}")
        chunks, size = [], 0
        async for chunk in http.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise ApiError(413, f"the body is larger than this server takes ({self.max_body_bytes} bytes)")
            chunks.append(chunk)
        body = parsed(schema, b"".join(chunks), self.n_vocab)
        self._check_model(getattr(body, "model", None))
        return body

    def _check_model(self, model: str | None) -> None:
        """Any ``model``, or none, names the one model served, as with llama-server; with
        ``strict_model`` only its id and aliases do (404 for another name, 400 for none)."""
        if not self.strict_model:
            return
        if model is None:
            raise ApiError(400, "missing required parameter: model", param="model")
        if model not in self.model_names:
            raise ApiError(
                404,
                f"the model {model!r} does not exist; this server has {', '.join(map(repr, self.model_names))}",
                param="model",
                code="model_not_found",
            )

    async def _respond(
        self, http: HttpRequest, envelope: Envelope, generations: list[_Generation], stream: bool, choices: _Choices
    ) -> Response:
        if stream:
            return event_stream(self._events(envelope, generations, choices), {"X-Request-Id": envelope.id})
        completions = await self._completed(http, envelope, generations)
        if completions is None:
            return Response(status_code=CLIENT_GONE)
        whole = [
            choices.whole(generation, completion)
            for generation, completion in zip(generations, completions, strict=True)
        ]
        usage = total_usage(_firsts(generations, completions), completions)
        return JSONResponse(envelope.whole(whole, usage), headers={"X-Request-Id": envelope.id})

    async def _events(
        self, envelope: Envelope, generations: list[_Generation], choices: _Choices
    ) -> AsyncIterator[str]:
        """Server-sent events: a first chunk per choice, its text as generated, its end; then
        the usage if asked for, then ``[DONE]``. Leaving early (the client went away) cancels
        every choice."""
        try:
            for generation in generations:
                if (first := choices.opening(generation)) is not None:
                    yield envelope.event([first])
            offsets = [0] * len(generations)
            async for index, delta in _merged(generations):
                if (chunk := choices.piece(generations[index], delta, offsets[index])) is not None:
                    yield envelope.event([chunk])
                offsets[index] += len(delta[0])
            completions = [await generation.request for generation in generations]
            await self._finished(envelope, generations, completions)
            for generation, completion in zip(generations, completions, strict=True):
                yield envelope.event([choices.closing(generation, completion)])
            if envelope.include_usage:
                yield envelope.event([], usage=total_usage(_firsts(generations, completions), completions))
            yield "data: [DONE]\n\n"
        except Exception as error:
            failure = openai_error(error, "the request failed while generating")
            if not isinstance(failure, ApiError):
                raise
            yield event(failure.body())
        finally:
            for generation in generations:
                generation.request.cancel()

    async def _completed(
        self, http: HttpRequest, envelope: _Identified, generations: list[_Generation]
    ) -> list[Completion] | None:
        """The generations' completions, counted and logged (``_finished``); None (the generations cancelled)
        if the client leaves first."""
        try:
            completions = await _unless_disconnected(http, [generation.request for generation in generations])
        except Exception as error:
            raise openai_error(error, "the request failed while generating") from None
        if completions is not None:
            await self._finished(envelope, generations, completions)
        return completions

    async def _finished(
        self, envelope: _Identified, generations: list[_Generation], completions: list[Completion]
    ) -> None:
        """Counts and logs a response whose choices all ended; a choice the engine cancelled
        (it was closed) fails the response, and so does a value its schema's check refuses (the
        check runs in a worker thread: its work is bounded, not small)."""
        for generation, completion in zip(generations, completions, strict=True):
            self.metrics.record(completion, prompt_counted=generation.first_of_prompt)
        if any(completion.finish_reason == "cancelled" for completion in completions):
            raise _shutting_down()
        for generation, completion in zip(generations, completions, strict=True):
            if generation.check is not None and completion.finish_reason == "stop":
                try:
                    await asyncio.to_thread(generation.check.validate, completion.text)
                except SchemaError as error:
                    raise openai_error(error, "the output breaks the schema", generation.schema_param) from None
        first = completions[0]
        generated = sum(c.completion_tokens for c in completions)
        logger.info(
            "%s done: %d choice(s), prompt %d tokens (%d cached), completion %d tokens, queued %.3f s, "
            "first token after %.3f s, %.1f tokens/s",
            envelope.id,
            len(completions),
            first.prompt_tokens,
            first.cached_tokens,
            generated,
            first.queue_seconds,
            first.first_token_seconds or 0.0,
            first.tokens_per_second,
            extra={
                "request_id": envelope.id,
                "prompt_tokens": first.prompt_tokens,
                "cached_tokens": first.cached_tokens,
                "completion_tokens": generated,
                "queue_seconds": first.queue_seconds,
                "first_token_seconds": first.first_token_seconds,
            },
        )


class _CompletionChoices:
    """``text_completion`` choices: the text, and its log-probabilities when asked for."""

    def __init__(self, serving: Serving, logprobs: bool, top: int) -> None:
        self.model = serving.model
        self.logprobs = logprobs
        self.top = top

    def opening(self, generation: _Generation) -> Choice | None:
        return None

    def piece(self, generation: _Generation, delta: Delta, offset: int) -> CompletionChoice:
        text, logprobs = delta
        shown = completion_logprobs(self.model, logprobs, self.top, offset) if self.logprobs else None
        return {"index": generation.index, "text": text, "logprobs": shown, "finish_reason": None}

    def closing(self, generation: _Generation, completion: Completion) -> CompletionChoice:
        return {"index": generation.index, "text": "", "logprobs": None, "finish_reason": completion.finish_reason}

    def whole(self, generation: _Generation, completion: Completion) -> CompletionChoice:
        return {
            **self.piece(generation, (completion.text, completion.logprobs), 0),
            "finish_reason": completion.finish_reason,
        }


class _ChatChoices:
    """``chat.completion`` choices: the assistant message (a tool call is only known whole: when
    streamed, it comes in the last delta; a thinking model's reasoning streams as
    ``reasoning_content`` deltas, as llama-server's), and the log-probabilities when asked for."""

    def __init__(self, serving: Serving, chat: PreparedChat, logprobs: bool, top: int) -> None:
        self.model = serving.model
        self.chat = chat
        self.logprobs = logprobs
        self.top = top
        # Each streamed choice's deltas, by choice.
        self.streams: dict[int, ReplyStream] = {}

    def _stream(self, generation: _Generation) -> ReplyStream:
        return self.streams.setdefault(generation.index, self.chat.reply_stream())

    def opening(self, generation: _Generation) -> ChatChunkChoice:
        return {
            "index": generation.index,
            "delta": {"role": "assistant"},  # no content yet, as OpenAI's first chunk
            "logprobs": None,
            "finish_reason": None,
        }

    def piece(self, generation: _Generation, delta: Delta, offset: int) -> ChatChunkChoice | None:
        text, logprobs = delta
        pieces: dict[str, Any] = self._stream(generation).feed(text)
        shown = chat_logprobs(self.model, logprobs, self.top) if self.logprobs else None
        if not pieces and (shown is None or self.chat.with_tools):
            return None
        return {"index": generation.index, "delta": pieces, "logprobs": shown, "finish_reason": None}

    def closing(self, generation: _Generation, completion: Completion) -> ChatChunkChoice:
        message, finish = self._message(completion)
        delta: dict[str, Any] = self._stream(generation).rest(message)
        if self.chat.with_tools:
            delta.update(_streamed(message))
        return {"index": generation.index, "delta": delta, "logprobs": None, "finish_reason": finish}

    def whole(self, generation: _Generation, completion: Completion) -> ChatChoice:
        message, finish = self._message(completion)
        shown = chat_logprobs(self.model, completion.logprobs, self.top) if self.logprobs else None
        return {"index": generation.index, "message": message, "logprobs": shown, "finish_reason": finish}

    def _message(self, completion: Completion) -> tuple[dict[str, Any], str]:
        """The reply as OpenAI's message, and its finish reason: "tool_calls" for calls that
        ended the reply."""
        message = {**self.chat.reply(completion.text), "refusal": None}
        calls = message.get("tool_calls") and completion.finish_reason == "stop"
        return message, "tool_calls" if calls else completion.finish_reason


def _streamed(message: dict[str, Any]) -> dict[str, Any]:
    """A whole reply as the last streamed delta: content, or the tool calls with their index."""
    calls = message.get("tool_calls")
    if not calls:
        return {"content": message["content"]}
    return {"tool_calls": [{"index": index, **call} for index, call in enumerate(calls)]}


def event_stream(events: AsyncIterator[str], headers: dict[str, str]) -> StreamingResponse:
    """Server-sent ``events``, unbuffered by proxies, with ``headers`` (the request's id)."""
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
    )


def _constraint_param(body: SamplingBody) -> str:
    return "grammar" if body.grammar is not None else "response_format"


def _firsts(generations: list[_Generation], completions: list[Completion]) -> list[Completion]:
    return [
        completion
        for generation, completion in zip(generations, completions, strict=True)
        if generation.first_of_prompt
    ]


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


async def _merged(generations: list[_Generation]) -> AsyncIterator[tuple[int, Delta]]:
    """The deltas of all ``generations`` as they come, tagged with the generation's index."""
    if len(generations) == 1:
        async for delta in generations[0].request.adeltas():
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, Delta] | int | Exception] = asyncio.Queue()

    async def pump(generation: _Generation) -> None:
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
