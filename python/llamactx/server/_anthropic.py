"""Anthropic's Messages API (``/v1/messages``) on ``Serving``: a request's conversation becomes the
chat that ``Engine.prepare_chat`` renders, and its reply becomes content blocks, whole or as
Anthropic's stream of events, through the chat endpoint's submission, error table and metrics.
The app gives these routes' errors Anthropic's shape (``anthropic_error``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from llamactx._llamactx import Completion, LlamaModel
from llamactx._render import PreparedChat
from llamactx.server._anthropic_protocol import (
    CountTokensRequest,
    InputTokens,
    MessageEnvelope,
    MessageObject,
    MessagesRequest,
    anthropic_error,
    block_events,
    content_blocks,
    event,
)
from llamactx.server._protocol import ApiError, ContextLengthExceeded
from llamactx.server._serving import CLIENT_GONE, Serving, _Generation, _merged, event_stream, openai_error

__all__ = ["Messages"]


class Messages:
    """The handlers of ``/v1/messages`` and ``/v1/messages/count_tokens``, on ``serving``'s
    engine and checks."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    async def create(self, http: HttpRequest) -> Response:
        serving = self.serving
        body = await serving._body(http, MessagesRequest)
        sampling = body.sampling()
        inputs = body.chat_inputs()
        await serving._with_media_fetched(inputs.messages)

        def submit() -> tuple[PreparedChat, list[_Generation]]:
            chat = serving._rendered_chat(*inputs)
            generations = serving._submitted(
                sampling,
                [chat],
                serving.engine.submit_prepared,
                max_tokens=body.max_tokens,
                logprobs=0,
                constraint_param="tools",  # the only constraint a message has
            )
            return chat, generations

        # Rendering the template and compiling constraints take time the event loop cannot give.
        chat, generations = await asyncio.to_thread(submit)
        envelope = MessageEnvelope(serving.model_id, body.max_tokens)
        stops = body.stop_sequences or []
        if body.stream:
            return event_stream(self._events(envelope, chat, stops, generations), {"request-id": envelope.id})
        completions = await serving._completed(http, envelope, generations)
        if completions is None:
            return Response(status_code=CLIENT_GONE)
        (completion,) = completions
        return JSONResponse(self._message(envelope, chat, stops, completion), headers={"request-id": envelope.id})

    async def count_tokens(self, http: HttpRequest) -> Response:
        body = await self.serving._body(http, CountTokensRequest)
        inputs = body.chat_inputs()
        await self.serving._with_media_fetched(inputs.messages)
        try:
            chat = await asyncio.to_thread(self.serving._rendered_chat, *inputs)
        except ContextLengthExceeded as error:  # too long to answer, not to count
            counted: InputTokens = {"input_tokens": error.n_prompt_tokens}
        else:
            counted = {"input_tokens": chat.n_tokens}
        return JSONResponse(counted)

    def _message(
        self, envelope: MessageEnvelope, chat: PreparedChat, stops: Sequence[str], completion: Completion
    ) -> MessageObject:
        content = content_blocks(chat.reply(completion.text))
        return envelope.finished(content, completion, _matched_stop(self.serving.model, completion, stops))

    async def _events(
        self, envelope: MessageEnvelope, chat: PreparedChat, stops: Sequence[str], generations: list[_Generation]
    ) -> AsyncIterator[str]:
        """Anthropic's stream: the message started; its text as generated, in one text block
        opened by the first text (a reply that may call tools is only known whole, so its blocks
        come at its end); its stop reason and usage; the message stopped. A failure is an
        ``error`` event. Leaving early (the client went away) cancels the request."""
        texts = not chat.with_tools
        opened = False
        try:
            yield event("message_start", message=envelope.started(chat.n_tokens))
            async for _, (text, _logprobs) in _merged(generations):
                if texts and text:
                    if not opened:
                        yield event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                        opened = True
                    yield event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})
            completions = [await generation.request for generation in generations]
            await self.serving._finished(envelope, generations, completions)
            (completion,) = completions
            message = self._message(envelope, chat, stops, completion)
            if opened:
                yield event("content_block_stop", index=0)
            elif not texts:
                for index, block in enumerate(message["content"]):
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
