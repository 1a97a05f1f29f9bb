"""OpenAI's API on the pipeline (``_pipeline``): completions, chat completions and embeddings,
their choices shown as OpenAI's objects, whole or as a stream of chunks, and the model list.
Every exception reaches the client through one table, ``_errors.ERRORS``."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import numpy as np
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from llamactx._embedding import embed, input_tokens
from llamactx._engine import Delta
from llamactx._llamactx import Completion, LlamaModel
from llamactx._reasoning import ReplyStream
from llamactx._render import PreparedChat
from llamactx.server._api import OPENAI_PREFIXES, Api
from llamactx.server._errors import CLIENT_GONE, ApiError, openai_error
from llamactx.server._generations import Generation, event_stream, merged
from llamactx.server._openai_protocol import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    LoraScales,
    SamplingBody,
    parsed,
)
from llamactx.server._openai_replies import (
    ChatChoice,
    ChatChunkChoice,
    Choice,
    CompletionChoice,
    EmbeddingList,
    Envelope,
    ModelCard,
    chat_logprobs,
    completion_logprobs,
    event,
    total_usage,
)
from llamactx.server._pipeline import UNLIMITED, Pipeline

__all__ = ["OpenAi"]


class _Choices(Protocol):
    """How one endpoint shows its choices: whole, or as the chunks of a stream (None: no chunk)."""

    def opening(self, generation: Generation) -> Choice | None: ...

    def piece(self, generation: Generation, delta: Delta, offset: int) -> Choice | None: ...

    def closing(self, generation: Generation, completion: Completion) -> Choice: ...

    def whole(self, generation: Generation, completion: Completion) -> Choice: ...


class OpenAi:
    """OpenAI's endpoints on ``pipeline`` (``/v1/embeddings`` with its embeddings context)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.created = int(time.time())

    def api(self) -> Api:
        """OpenAI's routes, where ``OPENAI_PREFIXES`` say."""
        routes = [
            ("GET", "/models", self.list_models),
            ("GET", "/models/{model:path}", self.get_model),
            ("POST", "/completions", self.completions),
            ("POST", "/chat/completions", self.chat),
            ("POST", "/embeddings", self.embeddings_route),
            ("GET", "/lora-adapters", self.lora_adapters),
            ("POST", "/lora-adapters", self.set_lora_adapters),
        ]
        return Api(routes, prefixes=OPENAI_PREFIXES)

    async def lora_adapters(self, http: HttpRequest) -> Response:
        """llama-server's list of the adapters loaded: the engine's one adapter (id 0) with its
        file and the scale of requests that name none, or none."""
        engine = self.pipeline.engine
        if engine.lora_adapter is None:
            return JSONResponse([])
        return JSONResponse([{"id": 0, "path": str(engine.lora_adapter.path), "scale": engine.lora_scale}])

    async def set_lora_adapters(self, http: HttpRequest) -> Response:
        """llama-server's ``POST /lora-adapters``: the scale of requests that name none, for
        the adapter listed (an adapter left out is at 0)."""
        scales = parsed(LoraScales, await self.pipeline.raw_body(http), self.pipeline.n_vocab)
        scale = self.pipeline.lora_scale(scales.root)
        assert scale is not None  # a list was given; its scales are finite (the body's model)
        self.pipeline.engine.lora_scale = scale
        return JSONResponse({"success": True})

    async def list_models(self, http: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card(name) for name in self.pipeline.model_names]})

    async def get_model(self, http: HttpRequest) -> Response:
        name = http.path_params["model"]
        if name not in self.pipeline.model_names:
            raise ApiError(404, f"the model {name!r} does not exist", code="model_not_found")
        return JSONResponse(self._model_card(name))

    def _model_card(self, name: str) -> ModelCard:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "llamactx"}

    async def completions(self, http: HttpRequest) -> Response:
        body = await self.pipeline.body(http, CompletionRequest)
        top = body.logprobs or 0

        def submit() -> list[Generation]:
            prompts = [self._prompt_tokens(prompt) for prompt in body.prompts()]
            return self.pipeline.submit(
                body,
                prompts,
                self.pipeline.engine.submit,
                max_tokens=UNLIMITED if body.max_tokens is None else body.max_tokens,
                logprobs=_engine_logprobs(body.logprobs is not None, top),
                constraint_param=_constraint_param(body),
            )

        # Tokenizing and compiling constraints take time the event loop cannot give.
        generations = await asyncio.to_thread(submit)
        envelope = Envelope("cmpl", "text_completion", self.pipeline.model_id, body.stream_options)
        choices = _CompletionChoices(self.pipeline.model, body.logprobs is not None, top)
        return await self._respond(http, envelope, generations, body.stream, choices)

    def _prompt_tokens(self, prompt: str | list[int]) -> list[int]:
        try:
            tokens = self.pipeline.engine.tokens(prompt)
        except Exception as error:
            raise openai_error(error, "the prompt cannot be read", "prompt") from None
        self.pipeline.check_fits(len(tokens))
        return tokens

    async def chat(self, http: HttpRequest) -> Response:
        body = await self.pipeline.body(http, ChatRequest)
        limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        top = body.top_logprobs or 0
        messages = await self.pipeline.media_fetched(
            [message.model_dump(exclude_none=True) for message in body.messages]
        )

        def submit() -> tuple[PreparedChat, list[Generation]]:
            chat = self._prepared_chat(body, messages)
            generations = self.pipeline.submit(
                body,
                [chat],
                self.pipeline.engine.submit_prepared,
                max_tokens=UNLIMITED if limit is None else limit,
                logprobs=_engine_logprobs(body.logprobs, top),
                constraint_param="tools" if chat.with_tools else _constraint_param(body),
            )
            return chat, generations

        # Rendering the template and compiling constraints take time the event loop cannot give.
        chat, generations = await asyncio.to_thread(submit)
        envelope = Envelope("chatcmpl", "chat.completion", self.pipeline.model_id, body.stream_options)
        return await self._respond(
            http, envelope, generations, body.stream, _ChatChoices(self.pipeline.model, chat, body.logprobs, top)
        )

    def _prepared_chat(self, body: ChatRequest, messages: list[dict[str, Any]]) -> PreparedChat:
        """The chat of ``body``, whose ``messages`` are given as dicts (``Pipeline.render``)."""
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools or ()]
        choice = body.tool_choice or "auto"
        named = choice if isinstance(choice, str) else choice.model_dump()
        kwargs = body.chat_template_kwargs
        return self.pipeline.render(
            messages,
            tools,
            named,
            body.parallel_tool_calls,
            template_kwargs=kwargs,
            reasoning_format=body.reasoning_format,
        )

    async def embeddings_route(self, http: HttpRequest) -> Response:
        body = await self.pipeline.body(http, EmbeddingRequest)
        if self.pipeline.embeddings is None:
            raise ApiError(404, "this server computes no embeddings: start it with --embeddings", code="not_found")
        n_embd = self.pipeline.model.n_embd()
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
            "model": self.pipeline.model_id,
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }
        return JSONResponse(answer)

    def _embed(self, inputs: list[str | list[int]]) -> tuple[np.ndarray[Any, np.dtype[np.float32]], int]:
        assert self.pipeline.embeddings is not None
        with self.pipeline.embeddings_lock:
            vectors = embed(self.pipeline.embeddings, inputs)
        return vectors, sum(len(input_tokens(self.pipeline.model, one)) for one in inputs)

    async def _respond(
        self, http: HttpRequest, envelope: Envelope, generations: list[Generation], stream: bool, choices: _Choices
    ) -> Response:
        if stream:
            return event_stream(self._events(envelope, generations, choices), {"X-Request-Id": envelope.id})
        completions = await self.pipeline.completed(http, envelope, generations)
        if completions is None:
            return Response(status_code=CLIENT_GONE)
        whole = [
            choices.whole(generation, completion)
            for generation, completion in zip(generations, completions, strict=True)
        ]
        usage = total_usage(_firsts(generations, completions), completions)
        return JSONResponse(envelope.whole(whole, usage), headers={"X-Request-Id": envelope.id})

    async def _events(self, envelope: Envelope, generations: list[Generation], choices: _Choices) -> AsyncIterator[str]:
        """Server-sent events: a first chunk per choice, its text as generated, its end; then
        the usage if asked for, then ``[DONE]``. Leaving early (the client went away) cancels
        every choice."""
        try:
            for generation in generations:
                if (first := choices.opening(generation)) is not None:
                    yield envelope.event([first])
            offsets = [0] * len(generations)
            async for index, delta in merged(generations):
                if (chunk := choices.piece(generations[index], delta, offsets[index])) is not None:
                    yield envelope.event([chunk])
                offsets[index] += len(delta[0])
            completions = [await generation.request for generation in generations]
            await self.pipeline.finished(envelope, generations, completions)
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


class _CompletionChoices:
    """``text_completion`` choices: the text, and its log-probabilities when asked for."""

    def __init__(self, model: LlamaModel, logprobs: bool, top: int) -> None:
        self.model = model
        self.logprobs = logprobs
        self.top = top

    def opening(self, generation: Generation) -> Choice | None:
        return None

    def piece(self, generation: Generation, delta: Delta, offset: int) -> CompletionChoice:
        text, logprobs = delta
        shown = completion_logprobs(self.model, logprobs, self.top, offset) if self.logprobs else None
        return {"index": generation.index, "text": text, "logprobs": shown, "finish_reason": None}

    def closing(self, generation: Generation, completion: Completion) -> CompletionChoice:
        return {"index": generation.index, "text": "", "logprobs": None, "finish_reason": completion.finish_reason}

    def whole(self, generation: Generation, completion: Completion) -> CompletionChoice:
        return {
            **self.piece(generation, (completion.text, completion.logprobs), 0),
            "finish_reason": completion.finish_reason,
        }


class _ChatChoices:
    """``chat.completion`` choices: the assistant message (a tool call is only known whole: when
    streamed, it comes in the last delta; a thinking model's reasoning streams as
    ``reasoning_content`` deltas, as llama-server's), and the log-probabilities when asked for."""

    def __init__(self, model: LlamaModel, chat: PreparedChat, logprobs: bool, top: int) -> None:
        self.model = model
        self.chat = chat
        self.logprobs = logprobs
        self.top = top
        # Each streamed choice's deltas, by choice.
        self.streams: dict[int, ReplyStream] = {}

    def _stream(self, generation: Generation) -> ReplyStream:
        return self.streams.setdefault(generation.index, self.chat.reply_stream())

    def opening(self, generation: Generation) -> ChatChunkChoice:
        return {
            "index": generation.index,
            "delta": {"role": "assistant"},  # no content yet, as OpenAI's first chunk
            "logprobs": None,
            "finish_reason": None,
        }

    def piece(self, generation: Generation, delta: Delta, offset: int) -> ChatChunkChoice | None:
        text, logprobs = delta
        pieces: dict[str, Any] = self._stream(generation).feed(text)
        shown = chat_logprobs(self.model, logprobs, self.top) if self.logprobs else None
        if not pieces and (shown is None or self.chat.with_tools):
            return None
        return {"index": generation.index, "delta": pieces, "logprobs": shown, "finish_reason": None}

    def closing(self, generation: Generation, completion: Completion) -> ChatChunkChoice:
        message, finish = self._message(completion)
        delta: dict[str, Any] = self._stream(generation).rest(message)
        if self.chat.with_tools:
            delta.update(_streamed(message))
        return {"index": generation.index, "delta": delta, "logprobs": None, "finish_reason": finish}

    def whole(self, generation: Generation, completion: Completion) -> ChatChoice:
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


def _constraint_param(body: SamplingBody) -> str:
    return "grammar" if body.grammar is not None else "response_format"


def _firsts(generations: list[Generation], completions: list[Completion]) -> list[Completion]:
    return [
        completion
        for generation, completion in zip(generations, completions, strict=True)
        if generation.first_of_prompt
    ]


def _engine_logprobs(wanted: bool, top: int) -> int:
    """What the engine must collect: the chosen token's log-probability needs one alternative
    asked for even when the client wants none (``top_logprobs: 0``)."""
    return max(top, 1) if wanted else 0


def _encoded(vector: np.ndarray[Any, np.dtype[np.float32]], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(value) for value in vector]
