"""Anthropic's Messages API's replies as this server writes them: the message and its content
blocks (a thinking model's reasoning as a ``thinking`` block, the text, the calls as
``tool_use`` blocks), its stream of events, and Anthropic's error object."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal, TypedDict

from llamactx._llamactx import Completion
from llamactx.server._errors import ApiError

__all__ = [
    "ContentBlock",
    "ErrorObject",
    "InputTokens",
    "MessageEnvelope",
    "MessageObject",
    "anthropic_error",
    "block_events",
    "content_blocks",
    "event",
]

#: Anthropic's error types where they differ from OpenAI's for the same status.
RENAMED_ERRORS = {"server_error": "api_error"}
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"]


class TextContent(TypedDict):
    type: Literal["text"]
    text: str


class ToolUseContent(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ThinkingContent(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: str


ContentBlock = TextContent | ToolUseContent | ThinkingContent


class MessageUsage(TypedDict):
    """Prompt tokens computed (``input_tokens``) and reused (``cache_read_input_tokens``), as
    Anthropic counts them apart; none are written to a cache on request."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int


class MessageObject(TypedDict):
    """The reply: whole, or as ``message_start`` opens it (no content or stop reason yet)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage


class InputTokens(TypedDict):
    """``POST /v1/messages/count_tokens``."""

    input_tokens: int


class ErrorDetail(TypedDict):
    type: str
    message: str


class ErrorObject(TypedDict):
    """Anthropic's error object."""

    type: Literal["error"]
    error: ErrorDetail


def content_blocks(reply: dict[str, Any]) -> list[ContentBlock]:
    """OpenAI's assistant message (the chat's parsed reply) as content blocks: its reasoning
    and its text, each if any, then its calls."""
    blocks: list[ContentBlock] = []
    if reply.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": reply["reasoning_content"], "signature": ""})
    if reply.get("content"):
        blocks.append({"type": "text", "text": reply["content"]})
    for call in reply.get("tool_calls") or ():
        function = call["function"]
        blocks.append({"type": "tool_use", "id": call["id"], "name": function["name"], "input": _input(function)})
    return blocks


def _input(function: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments as an object: the constraint makes them one; a template's own parser
    that does not (a call cut short) gives ``{}``, as llama-server does."""
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return {}
    return arguments if isinstance(arguments, dict) else {}


class MessageEnvelope:
    """What every object of one reply shares: its id and model, and the limit its stop reason
    is judged by."""

    def __init__(self, model_id: str, max_tokens: int) -> None:
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model_id = model_id
        self.max_tokens = max_tokens

    def started(self, prompt_tokens: int) -> MessageObject:
        """The message as ``message_start`` gives it: no content yet, and every prompt token
        counted as computed (the final usage says how many were reused)."""
        return self._message([], None, None, _usage(prompt_tokens, 0, 0))

    def finished(self, content: list[ContentBlock], completion: Completion, stop_sequence: str | None) -> MessageObject:
        """The whole message: ``content``, why ``completion`` ended (``stop_sequence``, the one
        that ended it, if any) and its usage."""
        reason = self._stop_reason(content, completion, stop_sequence)
        usage = _usage(completion.prompt_tokens, completion.cached_tokens, completion.completion_tokens)
        return self._message(content, reason, stop_sequence if reason == "stop_sequence" else None, usage)

    def _stop_reason(
        self, content: list[ContentBlock], completion: Completion, stop_sequence: str | None
    ) -> StopReason:
        """A reply cut short ends at ``max_tokens`` or else at the end of its sequence; one that
        ended otherwise with calls ends with them, as OpenAI's "tool_calls"."""
        if completion.finish_reason == "length":
            return "max_tokens" if completion.completion_tokens >= self.max_tokens else "model_context_window_exceeded"
        if any(block["type"] == "tool_use" for block in content):
            return "tool_use"
        return "end_turn" if stop_sequence is None else "stop_sequence"

    def _message(
        self, content: list[ContentBlock], reason: StopReason | None, stop_sequence: str | None, usage: MessageUsage
    ) -> MessageObject:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model_id,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }


def _usage(prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> MessageUsage:
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "output_tokens": completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    }


def event(name: str, **data: Any) -> str:
    """A server-sent event of Anthropic's stream: its name, and its data, whose ``type`` is the
    name."""
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False, separators=(',', ':'))}\n\n"


def block_events(index: int, block: ContentBlock) -> list[str]:
    """A whole content block as the events of a stream: started empty, its text, reasoning or
    input (as JSON) in one delta, stopped."""
    if block["type"] == "text":
        opened: dict[str, Any] = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    elif block["type"] == "thinking":
        opened = {"type": "thinking", "thinking": "", "signature": ""}
        delta = {"type": "thinking_delta", "thinking": block["thinking"]}
    else:
        opened = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    return [
        event("content_block_start", index=index, content_block=opened),
        event("content_block_delta", index=index, delta=delta),
        event("content_block_stop", index=index),
    ]


def anthropic_error(error: ApiError) -> ErrorObject:
    """``error`` as Anthropic's error object: its type follows from the status as OpenAI's does
    (``ApiError.body``), by Anthropic's name where it differs; the message starts with the
    parameter at fault when it does not name it (Anthropic's object has no ``param``)."""
    kind = error.body()["error"]["type"]
    kind = "request_too_large" if error.status == 413 else RENAMED_ERRORS.get(kind, kind)
    message = error.message
    if error.param is not None and error.param not in message:
        message = f"{error.param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}
