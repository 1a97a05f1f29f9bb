"""Anthropic's Messages API (``/v1/messages``) on the pipeline (``_pipeline``): a request's
conversation becomes the chat that ``Engine.prepare_chat`` renders, and its reply becomes
content blocks, whole or as Anthropic's stream of events, through the pipeline's submission,
error table and metrics. Its routes' errors have Anthropic's shape (``anthropic_error``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from llamactx._llamactx import Completion, LlamaModel
from llamactx._render import PreparedChat
from llamactx.server._anthropic_output import (
    InputTokens,
    MessageEnvelope,
    MessageObject,
    anthropic_error,
    block_events,
    content_blocks,
    event,
)
from llamactx.server._anthropic_protocol import CountTokensRequest, MessagesRequest
from llamactx.server._api import Api
from llamactx.server._errors import CLIENT_GONE, ApiError, ContextLengthExceeded, openai_error
from llamactx.server._generations import Generation, event_stream, merged
from llamactx.server._pipeline import Pipeline

__all__ = ["Messages"]


class Messages:
    """The handlers of ``/v1/messages`` and ``/v1/messages/count_tokens``, on ``pipeline``'s
    engine and checks."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def api(self) -> Api:
        """Anthropic's routes: its errors have Anthropic's shape, and its API key may also come
        as ``x-api-key`` (as Anthropic's clients send it)."""
        routes = [("POST", "/v1/messages", self.create), ("POST", "/v1/messages/count_tokens", self.count_tokens)]
        headers = ("x-api-key", "authorization")
        return Api(routes, error_body=anthropic_error, key_headers=headers, namespace="/v1/messages")

    async def create(self, http: HttpRequest) -> Response:
        pipeline = self.pipeline
        body = await pipeline.body(http, MessagesRequest)
        sampling = body.sampling()
        inputs = body.chat_inputs()
        await pipeline.media_fetched(inputs.messages)

        def submit() -> tuple[PreparedChat, list[Generation]]:
            chat = pipeline.render(*inputs)
            generations = pipeline.submit(
                sampling,
                [chat],
                pipeline.engine.submit_prepared,
                max_tokens=body.max_tokens,
                logprobs=0,
                constraint_param="tools",  # the only constraint a message has
            )
            return chat, generations

        # Rendering the template and compiling constraints take time the event loop cannot give.
        chat, generations = await asyncio.to_thread(submit)
        envelope = MessageEnvelope(pipeline.model_id, body.max_tokens)
        stops = body.stop_sequences or []
        if body.stream:
            return event_stream(self._events(envelope, chat, stops, generations), {"request-id": envelope.id})
        completions = await pipeline.completed(http, envelope, generations)
        if completions is None:
            return Response(status_code=CLIENT_GONE)
        (completion,) = completions
        message = self._message(envelope, chat.reply(completion.text), stops, completion)
        return JSONResponse(message, headers={"request-id": envelope.id})

    async def count_tokens(self, http: HttpRequest) -> Response:
        body = await self.pipeline.body(http, CountTokensRequest)
        inputs = body.chat_inputs()
        await self.pipeline.media_fetched(inputs.messages)
        try:
            chat = await asyncio.to_thread(self.pipeline.render, *inputs)
        except ContextLengthExceeded as error:  # too long to answer, not to count
            counted: InputTokens = {"input_tokens": error.n_prompt_tokens}
        else:
            counted = {"input_tokens": chat.n_tokens}
        return JSONResponse(counted)

    def _message(
        self, envelope: MessageEnvelope, reply: dict[str, Any], stops: Sequence[str], completion: Completion
    ) -> MessageObject:
        """The message of ``reply`` (the chat's parsed reply, OpenAI's message)."""
        return envelope.finished(
            content_blocks(reply), completion, _matched_stop(self.pipeline.model, completion, stops)
        )

    async def _events(
        self, envelope: MessageEnvelope, chat: PreparedChat, stops: Sequence[str], generations: list[Generation]
    ) -> AsyncIterator[str]:
        """Anthropic's stream: the message started; its reasoning and its text as generated,
        each in a block opened by its first piece (a thinking block, then a text block; a reply
        that may call tools is only known whole, so its text and calls come at its end); its
        stop reason and usage; the message stopped. A failure is an ``error`` event. Leaving
        early (the client went away) cancels the request."""
        stream = chat.reply_stream()
        blocks = _OpenBlocks()
        try:
            yield event("message_start", message=envelope.started(chat.n_tokens))
            async for _, (text, _logprobs) in merged(generations):
                for line in blocks.pieces(stream.feed(text)):
                    yield line
            completions = [await generation.request for generation in generations]
            await self.pipeline.finished(envelope, generations, completions)
            (completion,) = completions
            reply = chat.reply(completion.text)
            message = self._message(envelope, reply, stops, completion)
            for line in blocks.pieces(stream.rest(reply)):
                yield line
            for line in blocks.close():
                yield line
            if chat.with_tools:
                streamed = "thinking" if stream.splits_reasoning else None
                whole = [block for block in message["content"] if block["type"] != streamed]
                for index, block in enumerate(whole, start=blocks.count):
                    for line in block_events(index, block):
                        yield line
            delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
            yield event("message_delta", delta=delta, usage=message["usage"])
            yield event("message_stop")
        except Exception as error:
            failure = openai_error(error, "the request failed while generating")
            if not isinstance(failure, ApiError):
                raise
            yield event("error", error=anthropic_error(failure)["error"])
        finally:
            for generation in generations:
                generation.request.cancel()


class _OpenBlocks:
    """The content blocks a stream opens as its pieces come: a thinking block for reasoning, a
    text block for text, each opened by its first piece and stopped when the other kind comes
    or the reply ends; ``count`` blocks are stopped."""

    #: Each piece's block: its type, and its delta's type.
    KINDS: ClassVar[dict[str, tuple[str, str]]] = {
        "reasoning_content": ("thinking", "thinking_delta"),
        "content": ("text", "text_delta"),
    }

    def __init__(self) -> None:
        self.count = 0
        self.open: str | None = None

    def pieces(self, deltas: Mapping[str, str]) -> Iterator[str]:
        """The events of ``deltas`` (a ``ReasoningStream``'s, or the text as ``content``)."""
        for key, text in deltas.items():
            if not text:
                continue
            kind, delta = self.KINDS[key]
            if self.open != key:
                yield from self.close()
                opened: dict[str, str] = {"type": kind, kind: ""}
                if kind == "thinking":
                    opened["signature"] = ""
                yield event("content_block_start", index=self.count, content_block=opened)
                self.open = key
            yield event("content_block_delta", index=self.count, delta={"type": delta, kind: text})

    def close(self) -> Iterator[str]:
        """The open block's end, if one is open."""
        if self.open is not None:
            yield event("content_block_stop", index=self.count)
            self.count += 1
            self.open = None


def _matched_stop(model: LlamaModel, completion: Completion, stops: Sequence[str]) -> str | None:
    """The stop sequence that ended ``completion``, whose finish reason says only "stop". A
    reply that ended without an end-of-generation token (``completion_tokens`` counts it,
    ``tokens`` does not) ended on a stop string, and its text ends where the first one found
    begins: the one of ``stops`` that its tokens' text goes on with (None: the template's own)."""
    if completion.finish_reason != "stop" or completion.completion_tokens > len(completion.tokens):
        return None
    # The engine's text: each token's bytes (special tokens as none), invalid UTF-8 replaced.
    generated = b"".join(model.token_to_bytes(token, False) for token in completion.tokens)
    rest = generated.decode("utf-8", errors="replace")[len(completion.text) :]
    return next((stop for stop in stops if rest.startswith(stop)), None)
