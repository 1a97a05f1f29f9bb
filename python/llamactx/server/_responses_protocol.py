"""OpenAI's Responses API as this server speaks it: the request body (``POST /v1/responses``), its
input items as the chat messages ``Engine.prepare_chat`` takes, and the shapes of the response
object and of its server-sent events. The body is checked once, by its pydantic model, as the
chat endpoint's is: a wrong type, an unknown field or an item this server cannot read (an image,
a file, a tool other than a function) is a 400 naming its path."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypedDict

from pydantic import Discriminator, Field, Tag, model_validator

from llamactx._llamactx import Completion
from llamactx._tools import ToolChoice
from llamactx.server._protocol import (
    ApiError,
    Function,
    JsonSchemaFormat,
    Probability,
    ResponseFormat,
    SamplingBody,
    TokenCount,
    _Body,
)

__all__ = [
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "InputItem",
    "MessageItem",
    "OutputItem",
    "ResponseEnvelope",
    "ResponseEvents",
    "ResponseObject",
    "ResponseRequest",
    "chat_messages",
    "conversation_items",
    "message_item",
    "output_items",
]

#: Content parts this server does not read: refused, naming the part.
REFUSED_PARTS = frozenset(["input_file", "input_audio"])


def _text_or_parts(value: Any) -> str:
    """Which of a text-or-list union to check ``value`` against, so that an error names that one
    only; the tags are the type names an error's path leaves out."""
    return "str" if isinstance(value, str) else "list"


def _item_kind(value: Any) -> str | None:
    """An input item's tag: its ``type`` ("message" when left out, as OpenAI's easy input
    messages are). Tags are not identifiers, so that an error's path names only the fields."""
    if not isinstance(value, dict):
        return None
    return f"type={value.get('type', 'message')}"


class ContentPart(_Body):
    """A text part of a message: the user's (``input_text``) or an earlier reply's
    (``output_text``, as a client sends back a response's output)."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") in REFUSED_PARTS:
            raise ValueError(f"{data['type']} parts are not supported: this server reads text and images")
        return data


class InputImagePart(_Body):
    """An image of a message: ``image_url`` a ``data:`` URL, or a URL that only a server made to
    fetch image URLs fetches. ``detail`` is accepted and ignored: the projector decides."""

    type: Literal["input_image"]
    image_url: str
    detail: Literal["auto", "low", "high"] | None = None

    def chat_part(self) -> dict[str, Any]:
        """The image as OpenAI's chat ``image_url`` part."""
        return {"type": "image_url", "image_url": {"url": self.image_url}}


def _part_kind(value: Any) -> str:
    """A message part's tag (not an identifier, as ``_item_kind``'s): an image or a text."""
    return "type=input_image" if isinstance(value, dict) and value.get("type") == "input_image" else "type=text"


#: A text, or text parts (which are read as their texts joined).
Content = Annotated[
    Annotated[str, Tag("str")] | Annotated[list[ContentPart], Tag("list")], Discriminator(_text_or_parts)
]
#: A message's text, or its text and image parts.
MessageContent = Annotated[
    Annotated[str, Tag("str")]
    | Annotated[
        list[
            Annotated[
                Annotated[ContentPart, Tag("type=text")] | Annotated[InputImagePart, Tag("type=input_image")],
                Discriminator(_part_kind),
            ]
        ],
        Tag("list"),
    ],
    Discriminator(_text_or_parts),
]


def _text(content: str | list[ContentPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _chat_content(content: str | list[ContentPart | InputImagePart]) -> str | list[dict[str, Any]]:
    """A message's content as chat's: its texts joined, or with images, chat's parts in order."""
    if isinstance(content, str):
        return content
    if not any(isinstance(part, InputImagePart) for part in content):
        return "".join(part.text for part in content if isinstance(part, ContentPart))
    return [
        part.chat_part() if isinstance(part, InputImagePart) else {"type": "text", "text": part.text}
        for part in content
    ]


class MessageItem(_Body):
    """A message of the conversation; ``id`` and ``status`` (of an output item sent back) are
    accepted and ignored."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: MessageContent
    id: str | None = None
    status: str | None = None


class FunctionCallItem(_Body):
    """A function call of an earlier reply."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Body):
    """What the function of call ``call_id`` returned."""

    type: Literal["function_call_output"]
    call_id: str
    output: Content
    id: str | None = None
    status: str | None = None


InputItem = Annotated[
    Annotated[MessageItem, Tag("type=message")]
    | Annotated[FunctionCallItem, Tag("type=function_call")]
    | Annotated[FunctionCallOutputItem, Tag("type=function_call_output")],
    Discriminator(
        _item_kind,
        custom_error_type="input_item",
        custom_error_message="an input item is an object of type message, function_call or function_call_output",
    ),
]


class FunctionTool(Function):
    """A function the reply may call; OpenAI's other tools (web search, files, ...) are refused."""

    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _functions_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("type"), str) and data["type"] != "function":
            raise ValueError(f"{data['type']} tools are not supported: this server calls functions only")
        return data

    def chat_tool(self) -> dict[str, Any]:
        """The tool as the chat endpoint takes it."""
        return {"type": "function", "function": self.model_dump(exclude={"type"}, exclude_none=True)}


class FunctionChoice(_Body):
    type: Literal["function"]
    name: str


class TextFormat(_Body):
    """``text.format``: any text, any JSON object, or JSON matching ``schema`` (enforced whether
    ``strict`` or not). OpenAI requires a json_schema's ``name``; it names nothing here, so
    clients that leave it out are served too."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _complete(self) -> TextFormat:
        if self.type != "json_schema":
            if {"name", "description", "schema_", "strict"} & self.model_fields_set:
                raise ApiError(400, "only a json_schema format has a name, schema or strict", param="text.format")
        elif self.schema_ is None:
            raise ApiError(400, "missing required parameter: text.format.schema", param="text.format.schema")
        return self

    def response_format(self) -> ResponseFormat:
        """The same constraint as the chat endpoint's ``response_format``."""
        if self.type != "json_schema" or self.schema_ is None:
            return ResponseFormat.model_validate({"type": self.type})
        schema = JsonSchemaFormat(
            name=self.name or "response", description=self.description, schema=self.schema_, strict=self.strict
        )
        return ResponseFormat.model_validate({"type": "json_schema", "json_schema": schema})


class TextConfig(_Body):
    format: TextFormat = TextFormat(type="text")


class Reasoning(_Body):
    """Accepted and ignored: the model reasons as its chat template makes it, and the output has
    no reasoning items."""

    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponseRequest(_Body):
    """``POST /v1/responses``: the reply to ``input`` (after the conversation of
    ``previous_response_id``), formatted with the model's chat template. Sampling values left
    out are llama.cpp's, as for the chat endpoint."""

    model: str | None = None
    input: Annotated[
        Annotated[str, Tag("str")] | Annotated[list[InputItem], Field(min_length=1), Tag("list")],
        Discriminator(_text_or_parts),
    ]
    instructions: str | None = None
    max_output_tokens: TokenCount | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Probability | None = None
    stream: bool | None = None
    text: TextConfig | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: (
        Annotated[
            dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]], Field(max_length=16)
        ]
        | None
    ) = None
    user: str | None = None
    truncation: Literal["disabled"] | None = None
    reasoning: Reasoning | None = None

    def input_items(self) -> list[InputItem]:
        """``input`` as items: a text is the user's message."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def text_format(self) -> TextFormat:
        return TextFormat(type="text") if self.text is None else self.text.format

    def sampling(self) -> SamplingBody:
        """The sampling and constraint of the chat endpoint's body with these values."""
        given = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "user": self.user,
            "response_format": self.text_format().response_format(),
        }
        return SamplingBody.model_validate({name: value for name, value in given.items() if value is not None})

    def chat_tools(self) -> list[dict[str, Any]]:
        return [tool.chat_tool() for tool in self.tools or ()]

    def chat_tool_choice(self) -> ToolChoice:
        choice = self.tool_choice or "auto"
        return choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}


def chat_messages(instructions: str | None, items: Sequence[InputItem]) -> list[dict[str, Any]]:
    """``instructions`` (a system message) and ``items`` as OpenAI's chat messages: function
    calls join the assistant message before them (or make one), and their outputs are ``tool``
    messages."""
    messages: list[dict[str, Any]] = [] if instructions is None else [{"role": "system", "content": instructions}]
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": _chat_content(item.content)})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
        else:
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    return messages


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


OutputItem = OutputMessage | OutputFunctionCall


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(message_id: str, text: str, status: str) -> OutputMessage:
    """The reply's ``text`` as a message item."""
    part: OutputText = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": message_id, "status": status, "role": "assistant", "content": [part]}


def output_items(reply: dict[str, Any], message_id: str, status: str) -> list[OutputItem]:
    """The chat's assistant ``reply`` as output items: its text (``message_id``; an empty text
    when it only calls tools is left out), then a ``function_call`` per call. ``status`` is the
    message's: "incomplete" when the reply was cut."""
    calls = reply.get("tool_calls") or []
    items: list[OutputItem] = []
    if reply.get("content") or not calls:
        items.append(message_item(message_id, reply.get("content") or "", status))
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


def usage(completion: Completion) -> ResponseUsage:
    return {
        "input_tokens": completion.prompt_tokens,
        "input_tokens_details": {"cached_tokens": completion.cached_tokens},
        "output_tokens": completion.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


class ResponseEnvelope:
    """What every snapshot of one response shares: its id, creation time and model, and the
    request's settings, echoed as OpenAI echoes them (the sampling values in effect)."""

    def __init__(self, body: ResponseRequest, sampling: SamplingBody, model_id: str) -> None:
        self.id = new_id("resp")
        self.message_id = new_id("msg")
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
            "usage": None if completion is None else usage(completion),
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "tools": [tool.model_dump() for tool in body.tools or ()],
            "tool_choice": tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(),
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": body.store is not False,
            "text": {"format": body.text_format().model_dump(by_alias=True, exclude_none=True)},
            "truncation": "disabled",
            "metadata": body.metadata or {},
            "user": body.user,
        }

    def finished(self, output: list[OutputItem], completion: Completion) -> ResponseObject:
        """The response once ``completion`` ended: "incomplete" when it was cut (by
        ``max_output_tokens`` or the end of the sequence)."""
        return self.snapshot("incomplete" if completion.finish_reason == "length" else "completed", output, completion)


class ResponseEvents:
    """The server-sent events of one response, numbered in order (``sequence_number``)."""

    def __init__(self) -> None:
        self.sequence = 0

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"

    def message_opened(self, index: int, message_id: str) -> list[str]:
        """A message item, before its text."""
        item = {"type": "message", "id": message_id, "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            self.event("response.output_item.added", output_index=index, item=item),
            self.event(
                "response.content_part.added", item_id=message_id, output_index=index, content_index=0, part=part
            ),
        ]

    def text_delta(self, index: int, message_id: str, delta: str) -> str:
        return self.event(
            "response.output_text.delta",
            item_id=message_id,
            output_index=index,
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    def message_closed(self, index: int, item: OutputMessage) -> list[str]:
        """A message item, after its text."""
        part = item["content"][0]
        return [
            self.event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            ),
            self.event(
                "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def item(self, index: int, item: OutputItem) -> list[str]:
        """A whole output item: a message with its text as one delta, or a function call with
        its arguments as one delta."""
        if item["type"] == "message":
            return [
                *self.message_opened(index, item["id"]),
                self.text_delta(index, item["id"], item["content"][0]["text"]),
                *self.message_closed(index, item),
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
