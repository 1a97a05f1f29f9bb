"""OpenAI's Responses API's requests as this server reads them: the request body
(``POST /v1/responses``) and its input items as the chat messages ``Engine.prepare_chat`` takes
(what goes back is ``_responses_output``'s). The body is checked once, by its pydantic model, as the
chat endpoint's is: a wrong type, an unknown field or an item this server cannot read (an image,
a file, a tool other than a function) is a 400 naming its path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from llamactx._tools import ToolChoice
from llamactx.server._errors import ApiError
from llamactx.server._openai_protocol import (
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
    "ReasoningItem",
    "ResponseRequest",
    "chat_messages",
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


class ReasoningText(_Body):
    """A reasoning item's text (``reasoning_text``), or its summary's (``summary_text``)."""

    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Body):
    """The reasoning of an earlier reply, as a client sends back a response's output: its text
    goes back to the template as that turn's ``reasoning_content`` (a summary, or encrypted
    content, which this server never writes, are accepted and not read)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None

    def text(self) -> str:
        return "".join(part.text for part in self.content or () if part.type == "reasoning_text")


InputItem = Annotated[
    Annotated[MessageItem, Tag("type=message")]
    | Annotated[FunctionCallItem, Tag("type=function_call")]
    | Annotated[FunctionCallOutputItem, Tag("type=function_call_output")]
    | Annotated[ReasoningItem, Tag("type=reasoning")],
    Discriminator(
        _item_kind,
        custom_error_type="input_item",
        custom_error_message="an input item is an object of type message, function_call, function_call_output "
        "or reasoning",
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


class ReasoningConfig(_Body):
    """``effort`` is the chat template's ``reasoning_effort`` (as llama-server's
    ``--reasoning-effort``: templates that read it, GPT-OSS's for one, think that much); a
    summary is not written: the output's reasoning item holds the reasoning itself."""

    effort: Annotated[str, Field(max_length=32)] | None = None
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
    reasoning: ReasoningConfig | None = None

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

    def template_kwargs(self) -> dict[str, Any] | None:
        """The chat template's variables: ``reasoning_effort``, when ``reasoning`` sets one."""
        effort = None if self.reasoning is None else self.reasoning.effort
        return None if effort is None else {"reasoning_effort": effort}

    def chat_tool_choice(self) -> ToolChoice:
        choice = self.tool_choice or "auto"
        return choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}


def chat_messages(instructions: str | None, items: Sequence[InputItem]) -> list[dict[str, Any]]:
    """``instructions`` (a system message) and ``items`` as OpenAI's chat messages: reasoning
    opens an assistant message (its ``reasoning_content``) that the reply's text and calls after
    it join; function calls join the assistant message before them (or make one), and their
    outputs are ``tool`` messages."""
    messages: list[dict[str, Any]] = [] if instructions is None else [{"role": "system", "content": instructions}]
    for item in items:
        if isinstance(item, ReasoningItem):
            messages.append({"role": "assistant", "content": None, "reasoning_content": item.text()})
        elif isinstance(item, MessageItem):
            last = messages[-1] if messages else {}
            reasoning_only = last.keys() == {"role", "content", "reasoning_content"} and last["content"] is None
            if item.role == "assistant" and reasoning_only:
                last["content"] = _chat_content(item.content)  # the reply after its reasoning
            else:
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
