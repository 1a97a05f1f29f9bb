"""OpenAI's Responses API (``/v1/responses``) on the pipeline (``_pipeline``): a request's input
items become the chat that ``Engine.prepare_chat`` renders, and its reply becomes output items,
whole or as the Responses stream of events, through the pipeline's submission, error table and
metrics.
Responses are kept, bounded, in memory, so that a follow-up names its predecessor
(``previous_response_id``) instead of sending the conversation again."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from llamactx._llamactx import Completion
from llamactx._render import PreparedChat
from llamactx.server._api import OPENAI_PREFIXES, Api
from llamactx.server._errors import CLIENT_GONE, ApiError, openai_error
from llamactx.server._generations import Generation, event_stream, merged
from llamactx.server._pipeline import UNLIMITED, Pipeline
from llamactx.server._responses_output import (
    ItemIds,
    OutputItem,
    ResponseEnvelope,
    ResponseEvents,
    ResponseObject,
    TextItem,
    conversation_items,
    output_items,
    text_item,
)
from llamactx.server._responses_protocol import InputItem, ResponseRequest, chat_messages

__all__ = ["MAX_STORED_BYTES", "MAX_STORED_RESPONSES", "ResponseStore", "Responses", "StoredResponse"]

#: The most responses kept for ``previous_response_id`` and ``GET /v1/responses/{id}``; the
#: oldest goes first.
MAX_STORED_RESPONSES = 1024
#: The most bytes they hold in all (each counted as its response's and its whole conversation's
#: JSON); the oldest goes first.
MAX_STORED_BYTES = 64 * 2**20


@dataclass(frozen=True)
class StoredResponse:
    """A response as answered, and its conversation for a follow-up to continue: the input items
    (after its predecessor's conversation, without the instructions, which OpenAI does not carry
    over) and then its output."""

    response: ResponseObject
    conversation: tuple[InputItem, ...]

    def size(self) -> int:
        """The bytes it counts for in the store: its JSON. A conversation shares its earlier
        items with its predecessor's, so this overcounts what it holds."""
        held = len(json.dumps(self.response, ensure_ascii=False))
        return held + sum(len(item.model_dump_json()) for item in self.conversation)


class ResponseStore:
    """The last responses kept, by id: at most ``max_responses`` of at most ``max_bytes`` in all
    (``StoredResponse.size``), the oldest evicted first. Used from the event loop only."""

    def __init__(self, max_responses: int = MAX_STORED_RESPONSES, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._responses: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._responses)

    def put(self, stored: StoredResponse) -> None:
        """Keeps ``stored``, evicting the oldest responses past the bounds (``stored`` itself when
        it alone is over ``max_bytes``)."""
        size = stored.size()
        self.delete(stored.response["id"])
        self._responses[stored.response["id"]] = (stored, size)
        self._bytes += size
        while self._responses and (len(self._responses) > self.max_responses or self._bytes > self.max_bytes):
            _, (_, evicted) = self._responses.popitem(last=False)
            self._bytes -= evicted

    def get(self, response_id: str) -> StoredResponse | None:
        kept = self._responses.get(response_id)
        return None if kept is None else kept[0]

    def delete(self, response_id: str) -> bool:
        """Forgets the response; False if it was not kept."""
        kept = self._responses.pop(response_id, None)
        if kept is None:
            return False
        self._bytes -= kept[1]
        return True


class Responses:
    """The handlers of ``/v1/responses``, on ``pipeline``'s engine and checks, with ``store``."""

    def __init__(self, pipeline: Pipeline, store: ResponseStore | None = None) -> None:
        self.pipeline = pipeline
        self.store = ResponseStore() if store is None else store

    def api(self) -> Api:
        """The Responses API's routes, where OpenAI's are."""
        routes = [
            ("POST", "/responses", self.create),
            ("GET", "/responses/{response_id}", self.retrieve),
            ("DELETE", "/responses/{response_id}", self.delete),
        ]
        return Api(routes, prefixes=OPENAI_PREFIXES)

    async def create(self, http: HttpRequest) -> Response:
        pipeline = self.pipeline
        body = await pipeline.body(http, ResponseRequest)
        conversation = [*self._continued(body.previous_response_id), *body.input_items()]
        sampling = body.sampling()
        messages = await pipeline.media_fetched(chat_messages(body.instructions, conversation), "input")

        def submit() -> tuple[PreparedChat, list[Generation]]:
            chat = pipeline.render(
                messages,
                body.chat_tools(),
                body.chat_tool_choice(),
                body.parallel_tool_calls is not False,
                messages_param="input",
                template_kwargs=body.template_kwargs(),
            )
            generations = pipeline.submit(
                sampling,
                [chat],
                pipeline.engine.submit_prepared,
                max_tokens=UNLIMITED if body.max_output_tokens is None else body.max_output_tokens,
                logprobs=0,
                constraint_param="tools" if chat.with_tools else "text.format",
            )
            return chat, generations

        # Rendering the template and compiling constraints take time the event loop cannot give.
        chat, generations = await asyncio.to_thread(submit)
        envelope = ResponseEnvelope(body, sampling, pipeline.model_id)
        if body.stream:
            return event_stream(self._events(envelope, chat, generations, conversation), {"X-Request-Id": envelope.id})
        completions = await pipeline.completed(http, envelope, generations)
        if completions is None:
            return Response(status_code=CLIENT_GONE)
        (completion,) = completions
        output = output_items(chat.reply(completion.text), envelope.item_ids, _message_status(completion))
        return JSONResponse(
            self._answered(envelope, conversation, output, completion), headers={"X-Request-Id": envelope.id}
        )

    async def retrieve(self, http: HttpRequest) -> Response:
        return JSONResponse(self._stored(http.path_params["response_id"]).response)

    async def delete(self, http: HttpRequest) -> Response:
        response_id = http.path_params["response_id"]
        if not self.store.delete(response_id):
            raise _not_stored(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    def _stored(self, response_id: str) -> StoredResponse:
        stored = self.store.get(response_id)
        if stored is None:
            raise _not_stored(response_id)
        return stored

    def _continued(self, response_id: str | None) -> tuple[InputItem, ...]:
        """The conversation that ``previous_response_id`` continues (none without one)."""
        if response_id is None:
            return ()
        stored = self.store.get(response_id)
        if stored is None:
            raise ApiError(
                400,
                f"the previous response {response_id!r} is not stored here (unknown, deleted, evicted or made "
                "with store: false)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return stored.conversation

    def _answered(
        self,
        envelope: ResponseEnvelope,
        conversation: list[InputItem],
        output: list[OutputItem],
        completion: Completion,
    ) -> ResponseObject:
        """The finished response, kept unless the request said ``store: false``."""
        reasoning = "".join(part["text"] for item in output if item["type"] == "reasoning" for part in item["content"])
        reasoning_tokens = len(self.pipeline.model.str_to_token(reasoning, False)) if reasoning else 0
        response = envelope.finished(output, completion, reasoning_tokens)
        if envelope.body.store is not False:
            self.store.put(StoredResponse(response, (*conversation, *conversation_items(output))))
        return response

    async def _events(
        self,
        envelope: ResponseEnvelope,
        chat: PreparedChat,
        generations: list[Generation],
        conversation: list[InputItem],
    ) -> AsyncIterator[str]:
        """The Responses stream: the response created and in progress, its output items as
        they are generated (its reasoning, then its message; a reply that may call tools is only
        known whole, so its message and calls come at its end), then the response completed or
        incomplete; a failure is an ``error`` event and the response failed. Leaving early (the
        client went away) cancels the request."""
        events = ResponseEvents()
        stream = chat.reply_stream()
        items = _StreamedItems(events, envelope.item_ids)
        try:
            started = envelope.snapshot("in_progress", [])
            yield events.event("response.created", response=started)
            yield events.event("response.in_progress", response=started)
            async for _, (text, _logprobs) in merged(generations):
                for line in items.pieces(stream.feed(text)):
                    yield line
            completions = [await generation.request for generation in generations]
            await self.pipeline.finished(envelope, generations, completions)
            (completion,) = completions
            status = _message_status(completion)
            reply = chat.reply(completion.text)
            for line in items.pieces(stream.rest(reply)):
                yield line
            if not chat.with_tools:
                for line in items.pieces({"content": ""}):  # a reply without text still has its message
                    yield line
            for line in items.close(status):
                yield line
            output = items.output
            if chat.with_tools:
                streamed = "reasoning" if stream.splits_reasoning else None
                rest = [item for item in output_items(reply, envelope.item_ids, status) if item["type"] != streamed]
                for index, item in enumerate(rest, start=len(output)):
                    for line in events.item(index, item):
                        yield line
                output = [*output, *rest]
            response = self._answered(envelope, conversation, output, completion)
            yield events.event(f"response.{response['status']}", response=response)
        except Exception as error:
            failure = openai_error(error, "the response failed while generating")
            if not isinstance(failure, ApiError):
                raise
            for line in events.failed(envelope, failure):
                yield line
        finally:
            for generation in generations:
                generation.request.cancel()


class _StreamedItems:
    """The output items a stream opens as its pieces come (a ``ReplyStream``'s deltas): a
    reasoning item for reasoning, a message for text, each opened by its first piece and closed,
    whole, when the other kind comes or the reply ends (``output``). A kind comes once: a piece
    of a kind already closed is not sent (a parser does not write reasoning after the text)."""

    KINDS: ClassVar[dict[str, Literal["message", "reasoning"]]] = {
        "reasoning_content": "reasoning",
        "content": "message",
    }

    def __init__(self, events: ResponseEvents, ids: ItemIds) -> None:
        self.events = events
        self.ids = ids
        self.output: list[OutputItem] = []
        self.open: Literal["message", "reasoning"] | None = None
        self.text = ""

    def pieces(self, deltas: Mapping[str, str]) -> Iterator[str]:
        for key, text in deltas.items():
            kind = self.KINDS[key]
            if kind != self.open:
                if any(item["type"] == kind for item in self.output) or not (text or kind == "message"):
                    continue
                yield from self.close("completed")
                yield from self.events.opened(len(self.output), kind, self._id(kind))
                self.open, self.text = kind, ""
            if text:
                self.text += text
                yield self.events.delta(len(self.output), kind, self._id(kind), text)

    def close(self, status: str) -> Iterator[str]:
        """The open item's end; ``status`` is a message's (a reasoning item closed by the end of
        the reply is "completed" too)."""
        if self.open is None:
            return
        item: TextItem = text_item(
            self.open, self._id(self.open), self.text, status if self.open == "message" else "completed"
        )
        yield from self.events.closed(len(self.output), item)
        self.output.append(item)
        self.open = None

    def _id(self, kind: Literal["message", "reasoning"]) -> str:
        return self.ids.message if kind == "message" else self.ids.reasoning


def _message_status(completion: Completion) -> str:
    """A reply's message status: "incomplete" when it was cut."""
    return "incomplete" if completion.finish_reason == "length" else "completed"


def _not_stored(response_id: str) -> ApiError:
    return ApiError(404, f"no response {response_id!r} is stored here", code="not_found")
