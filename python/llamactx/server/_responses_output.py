"""OpenAI's Responses API's replies as this server writes them: the output items of a reply (and
those items as the input that continues their conversation), the response object, and its
server-sent events."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from llamactx._llamactx import Completion
from llamactx.server._errors import ApiError
from llamactx.server._openai_protocol import SamplingBody
from llamactx.server._responses_protocol import (
    FunctionCallItem,
    InputItem,
    MessageItem,
    ReasoningItem,
    ReasoningText,
    ResponseRequest,
)

__all__ = [
    "OutputItem",
    "ResponseEnvelope",
    "ResponseEvents",
    "ResponseObject",
    "conversation_items",
    "new_id",
    "output_items",
    "text_item",
]


class OutputText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]


class OutputMessage(TypedDict):
    type: Literal["message"]
    id: str
    status: str
    role: Literal["assistant"]
    content: list[OutputText]


class OutputFunctionCall(TypedDict):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


class OutputReasoningText(TypedDict):
    type: Literal["reasoning_text"]
    text: str


class OutputReasoning(TypedDict):
    """A thinking model's reasoning, as its text (no summary is written)."""

    type: Literal["reasoning"]
    id: str
    summary: list[Any]
    content: list[OutputReasoningText]
    status: str


OutputItem = OutputMessage | OutputFunctionCall | OutputReasoning
#: An output item whose content is one text: the reply's message, or its reasoning.
TextItem = OutputMessage | OutputReasoning


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def text_item(kind: Literal["message", "reasoning"], item_id: str, text: str, status: str) -> TextItem:
    """The reply's ``text`` as a message item, or its reasoning's as a reasoning item."""
    if kind == "reasoning":
        return {
            "type": "reasoning",
            "id": item_id,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "status": status,
        }
    part: OutputText = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part]}


def output_items(reply: dict[str, Any], ids: ItemIds, status: str) -> list[OutputItem]:
    """The chat's assistant ``reply`` as output items: its reasoning, if any, and its text (an
    empty text when it only calls tools is left out), then a ``function_call`` per call.
    ``status`` is the text's: "incomplete" when the reply was cut."""
    calls = reply.get("tool_calls") or []
    items: list[OutputItem] = []
    if reply.get("reasoning_content"):
        items.append(text_item("reasoning", ids.reasoning, reply["reasoning_content"], "completed"))
    if reply.get("content") or not calls:
        items.append(text_item("message", ids.message, reply.get("content") or "", status))
    for call in calls:
        function = call["function"]
        items.append(
            {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
                "status": "completed",
            }
        )
    return items


def conversation_items(items: Sequence[OutputItem]) -> list[InputItem]:
    """Output items as the input items that continue their conversation."""
    continued: list[InputItem] = []
    for item in items:
        if item["type"] == "message":
            continued.append(MessageItem(role="assistant", content="".join(part["text"] for part in item["content"])))
        elif item["type"] == "reasoning":
            texts = [ReasoningText(type="reasoning_text", text=part["text"]) for part in item["content"]]
            continued.append(ReasoningItem(type="reasoning", content=texts))
        else:
            continued.append(
                FunctionCallItem(
                    type="function_call", call_id=item["call_id"], name=item["name"], arguments=item["arguments"]
                )
            )
    return continued


class InputTokensDetails(TypedDict):
    cached_tokens: int


class OutputTokensDetails(TypedDict):
    reasoning_tokens: int


class ResponseUsage(TypedDict):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(TypedDict):
    reason: Literal["max_output_tokens"]


class ResponseError(TypedDict):
    code: str
    message: str


class ResponseObject(TypedDict):
    """A response, whole or as a stream's snapshot, with the request's settings."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any]
    store: bool
    text: dict[str, Any]
    truncation: Literal["disabled"]
    metadata: dict[str, str]
    user: str | None


def usage(completion: Completion, reasoning_tokens: int) -> ResponseUsage:
    return {
        "input_tokens": completion.prompt_tokens,
        "input_tokens_details": {"cached_tokens": completion.cached_tokens},
        "output_tokens": completion.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


@dataclass(frozen=True)
class ItemIds:
    """The ids of a reply's message and reasoning items."""

    message: str = field(default_factory=lambda: new_id("msg"))
    reasoning: str = field(default_factory=lambda: new_id("rs"))


class ResponseEnvelope:
    """What every snapshot of one response shares: its id, creation time and model, its items'
    ids, and the request's settings, echoed as OpenAI echoes them (the sampling values in
    effect)."""

    def __init__(self, body: ResponseRequest, sampling: SamplingBody, model_id: str) -> None:
        self.id = new_id("resp")
        self.item_ids = ItemIds()
        self.created_at = int(time.time())
        self.model_id = model_id
        self.body = body
        self.sampling = sampling

    def snapshot(
        self,
        status: Literal["in_progress", "completed", "incomplete", "failed"],
        output: list[OutputItem],
        completion: Completion | None = None,
        error: ResponseError | None = None,
        reasoning_tokens: int = 0,
    ) -> ResponseObject:
        body = self.body
        tool_choice = body.tool_choice or "auto"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.model_id,
            "output": output,
            "usage": None if completion is None else usage(completion, reasoning_tokens),
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "tools": [tool.model_dump() for tool in body.tools or ()],
            "tool_choice": tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(),
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None if body.reasoning is None else body.reasoning.effort, "summary": None},
            "store": body.store is not False,
            "text": {"format": body.text_format().model_dump(by_alias=True, exclude_none=True)},
            "truncation": "disabled",
            "metadata": body.metadata or {},
            "user": body.user,
        }

    def finished(self, output: list[OutputItem], completion: Completion, reasoning_tokens: int) -> ResponseObject:
        """The response once ``completion`` ended: "incomplete" when it was cut (by
        ``max_output_tokens`` or the end of the sequence). ``reasoning_tokens`` of its output
        tokens are its reasoning's."""
        status: Literal["completed", "incomplete"] = (
            "incomplete" if completion.finish_reason == "length" else "completed"
        )
        return self.snapshot(status, output, completion, reasoning_tokens=reasoning_tokens)


class ResponseEvents:
    """The server-sent events of one response, numbered in order (``sequence_number``)."""

    def __init__(self) -> None:
        self.sequence = 0

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"

    def opened(self, index: int, kind: Literal["message", "reasoning"], item_id: str) -> list[str]:
        """A message or reasoning item, before its text."""
        item = {**text_item(kind, item_id, "", "in_progress"), "content": []}
        part = text_item(kind, item_id, "", "in_progress")["content"][0]
        return [
            self.event("response.output_item.added", output_index=index, item=item),
            self.event("response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part),
        ]

    def delta(self, index: int, kind: Literal["message", "reasoning"], item_id: str, delta: str) -> str:
        """A piece of a message's text (``output_text``) or of its reasoning's (``reasoning_text``)."""
        if kind == "reasoning":
            return self.event(
                "response.reasoning_text.delta", item_id=item_id, output_index=index, content_index=0, delta=delta
            )
        return self.event(
            "response.output_text.delta",
            item_id=item_id,
            output_index=index,
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    def closed(self, index: int, item: TextItem) -> list[str]:
        """A message or reasoning item, after its text."""
        part = item["content"][0]
        done = (
            self.event(
                "response.reasoning_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
            )
            if item["type"] == "reasoning"
            else self.event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
        )
        return [
            done,
            self.event(
                "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def item(self, index: int, item: OutputItem) -> list[str]:
        """A whole output item: a message or reasoning with its text as one delta, or a function
        call with its arguments as one delta."""
        if item["type"] != "function_call":
            return [
                *self.opened(index, item["type"], item["id"]),
                self.delta(index, item["type"], item["id"], item["content"][0]["text"]),
                *self.closed(index, item),
            ]
        return [
            self.event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            ),
            self.event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=item["arguments"],
            ),
            self.event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def failed(self, envelope: ResponseEnvelope, error: ApiError) -> list[str]:
        """OpenAI's ``error`` event, then the response as failed (without its unfinished
        output)."""
        code = error.code or ("server_error" if error.status >= 500 else "invalid_prompt")
        return [
            self.event("error", code=error.code, message=error.message, param=error.param),
            self.event(
                "response.failed",
                response=envelope.snapshot("failed", [], error={"code": code, "message": error.message}),
            ),
        ]
