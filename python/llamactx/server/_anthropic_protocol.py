"""Anthropic's Messages API's requests as this server reads them: the request bodies
(``POST /v1/messages`` and ``/v1/messages/count_tokens``) and their conversation as the chat
messages, tools and tool choice that ``Engine.prepare_chat`` takes (what goes back is
``_anthropic_output``'s). A body is checked once, by its pydantic model, as the OpenAI routes'
are: a wrong type, an unknown field or a block this server cannot read (a document) is a 400
naming its path. Image blocks become OpenAI's image parts, read as the chat endpoint reads them
(base64 data, or a URL only a server made to fetch fetches). ``cache_control`` and
``metadata`` are accepted and ignored: the prefix cache reuses a repeated prompt unasked.
``thinking`` sets the chat template's ``enable_thinking`` (false when disabled), as
``chat_template_kwargs`` does on the chat endpoint, and its ``budget_tokens`` the reasoning's
budget. A thinking model's reasoning (``reasoning_content``, llama.cpp's parser splits it out)
is a ``thinking`` block before the text, with an empty signature (nothing signs it); an earlier
reply's thinking blocks go back to the template as that turn's ``reasoning_content``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import Discriminator, Field, Tag, model_validator

from llamactx._limits import INT32_MAX
from llamactx._tools import ToolChoice
from llamactx.server._errors import ApiError
from llamactx.server._openai_protocol import NonEmpty, Probability, SamplingBody, _Body

__all__ = ["ChatInputs", "CountTokensRequest", "MessagesRequest"]

#: OpenAI's ``tool_choice`` for Anthropic's choices without a name.
CHAT_CHOICES: dict[str, Literal["none", "auto", "required"]] = {"auto": "auto", "any": "required", "none": "none"}
#: What a tool result's text starts with when the tool failed (``is_error``).
ERROR_PREFIX = "Error: "
#: The most stop sequences a request may give, as the chat endpoint's ``stop``.
MAX_STOP_SEQUENCES = 16


def _text_or_blocks(value: Any) -> str:
    return "str" if isinstance(value, str) else "list"


def _tagged(key: str) -> Callable[[Any], str | None]:
    """The discriminator of a union by ``key`` (a block's ``type``, a message's ``role``): tags
    are not identifiers, so that an error's path names only the fields."""

    def tag(value: Any) -> str | None:
        return f"{key}={value.get(key)}" if isinstance(value, dict) else None

    return tag


class CacheControl(_Body):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Body):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: None = None


def _text(content: str | list[TextBlock]) -> str | list[dict[str, str]]:
    """A text, or text blocks as OpenAI's text parts (the renderer reads them as chat's)."""
    return content if isinstance(content, str) else [{"type": "text", "text": block.text} for block in content]


class Base64Source(_Body):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class UrlSource(_Body):
    type: Literal["url"]
    url: str


class ImageBlock(_Body):
    """An image of a user's turn: base64 data, or a URL (fetched only by a server made to)."""

    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]
    cache_control: CacheControl | None = None

    def chat_part(self) -> dict[str, Any]:
        """The image as OpenAI's ``image_url`` part."""
        source = self.source
        url = source.url if isinstance(source, UrlSource) else f"data:{source.media_type};base64,{source.data}"
        return {"type": "image_url", "image_url": {"url": url}}


class ToolUseBlock(_Body):
    """A call of an earlier reply."""

    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None

    def chat_call(self) -> dict[str, Any]:
        """The call as OpenAI's ``tool_calls`` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": json.dumps(self.input)}}


class ThinkingBlock(_Body):
    """The reasoning of an earlier reply (its signature is not checked: nothing signs it here)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class ToolResultBlock(_Body):
    """What the tool of call ``tool_use_id`` returned."""

    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: Annotated[
        Annotated[str, Tag("str")] | Annotated[list[TextBlock], Tag("list")], Discriminator(_text_or_blocks)
    ] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None

    def chat_message(self) -> dict[str, Any]:
        """The result as OpenAI's ``tool`` message: a chat template has no error flag, so an
        error's text says it."""
        content = _text(self.content)
        if self.is_error and isinstance(content, str):
            content = ERROR_PREFIX + content
        elif self.is_error:
            content = [{"type": "text", "text": ERROR_PREFIX}, *content]
        return {"role": "tool", "tool_call_id": self.tool_use_id, "content": content}


#: A text, or text blocks.
Text = Annotated[
    Annotated[str, Tag("str")] | Annotated[NonEmpty[list[TextBlock]], Tag("list")], Discriminator(_text_or_blocks)
]


UserBlock = Annotated[
    Annotated[TextBlock, Tag("type=text")]
    | Annotated[ImageBlock, Tag("type=image")]
    | Annotated[ToolResultBlock, Tag("type=tool_result")],
    Discriminator(
        _tagged("type"),
        custom_error_type="content_block",
        custom_error_message="a user message's content blocks are of type text, image or tool_result "
        "(this server reads no documents)",
    ),
]
AssistantBlock = Annotated[
    Annotated[TextBlock, Tag("type=text")]
    | Annotated[ToolUseBlock, Tag("type=tool_use")]
    | Annotated[ThinkingBlock, Tag("type=thinking")],
    Discriminator(
        _tagged("type"),
        custom_error_type="content_block",
        custom_error_message="an assistant message's content blocks are of type text, tool_use or thinking",
    ),
]


class UserMessage(_Body):
    role: Literal["user"]
    content: Annotated[
        Annotated[str, Tag("str")] | Annotated[NonEmpty[list[UserBlock]], Tag("list")], Discriminator(_text_or_blocks)
    ]

    def chat_messages(self) -> list[dict[str, Any]]:
        """The turn as OpenAI's messages, in order: each tool result a ``tool`` message, the text
        and image blocks between them user messages of text and image parts."""
        if isinstance(self.content, str):
            return [{"role": "user", "content": self.content}]
        messages: list[dict[str, Any]] = []
        for block in self.content:
            if isinstance(block, ToolResultBlock):
                messages.append(block.chat_message())
                continue
            part = block.chat_part() if isinstance(block, ImageBlock) else {"type": "text", "text": block.text}
            if messages and messages[-1]["role"] == "user":
                messages[-1]["content"].append(part)
            else:
                messages.append({"role": "user", "content": [part]})
        return messages


class AssistantMessage(_Body):
    """An earlier reply. A last one is a turn of its own: the reply follows it, it does not
    continue it."""

    role: Literal["assistant"]
    content: Annotated[
        Annotated[str, Tag("str")] | Annotated[NonEmpty[list[AssistantBlock]], Tag("list")],
        Discriminator(_text_or_blocks),
    ]

    def chat_messages(self) -> list[dict[str, Any]]:
        """The turn as OpenAI's assistant message: its text parts (None without any), its
        calls and its reasoning."""
        if isinstance(self.content, str):
            return [{"role": "assistant", "content": self.content}]
        texts = _text([block for block in self.content if isinstance(block, TextBlock)])
        calls = [block.chat_call() for block in self.content if isinstance(block, ToolUseBlock)]
        reasoning = "".join(block.thinking for block in self.content if isinstance(block, ThinkingBlock))
        message: dict[str, Any] = {"role": "assistant", "content": texts or None}
        if calls:
            message["tool_calls"] = calls
        if reasoning:
            message["reasoning_content"] = reasoning
        return [message]


InputMessage = Annotated[
    Annotated[UserMessage, Tag("role=user")] | Annotated[AssistantMessage, Tag("role=assistant")],
    Discriminator(
        _tagged("role"),
        custom_error_type="message",
        custom_error_message='a message is an object of role "user" or "assistant" (the system prompt is `system`)',
    ),
]


class Tool(_Body):
    """A tool the reply may call (Anthropic's client tools; its server tools are refused). The
    schema is enforced, ``strict`` or not."""

    type: Literal["custom"] | None = None  # first: a server tool's error is its type
    name: Annotated[str, Field(min_length=1, max_length=64, pattern="^[A-Za-z0-9_-]+$")]
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None
    strict: bool | None = None

    def chat_tool(self) -> dict[str, Any]:
        """The tool as OpenAI's function tool."""
        function = {"name": self.name, "description": self.description, "parameters": self.input_schema}
        return {"type": "function", "function": {key: value for key, value in function.items() if value is not None}}


class ToolChoiceBody(_Body):
    """``tool_choice``: "auto", "any" (a call is required), "tool" (the one ``name``d) or "none";
    ``disable_parallel_tool_use`` allows one call at most."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoiceBody:
        if (self.type == "tool") != (self.name is not None):
            raise ApiError(400, 'tool_choice has a name when, and only when, its type is "tool"', param="tool_choice")
        return self

    def chat_choice(self) -> ToolChoice:
        """The choice as OpenAI's ``tool_choice``."""
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return CHAT_CHOICES[self.type]


class Thinking(_Body):
    """Whether the model thinks first: the chat template's ``enable_thinking``, and how many
    tokens it may think (see the module's note); the display is not used."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    display: Literal["summarized", "omitted"] | None = None


class Metadata(_Body):
    user_id: str | None = None


class ChatInputs(NamedTuple):
    """What ``Engine.prepare_chat`` takes."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    messages_param: str = "messages"
    #: The chat template's variables (``enable_thinking``, from ``thinking``).
    template_kwargs: dict[str, Any] | None = None
    #: The reasoning's budget in tokens (``thinking.budget_tokens``; None: the server's).
    reasoning_budget: int | None = None


class _Conversation(_Body):
    """What both routes read: the conversation, its system prompt and tools."""

    model: str | None = None
    messages: NonEmpty[list[InputMessage]]
    system: Text | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: ToolChoiceBody | None = None
    thinking: Thinking | None = None

    def chat_inputs(self) -> ChatInputs:
        """The conversation as OpenAI's chat: ``system`` is the first message, ``tool_use``
        blocks the assistant's ``tool_calls`` and ``tool_result`` blocks ``tool`` messages."""
        system = [] if self.system is None else [{"role": "system", "content": _text(self.system)}]
        messages = [*system, *(chat for message in self.messages for chat in message.chat_messages())]
        choice = self.tool_choice
        return ChatInputs(
            messages,
            [tool.chat_tool() for tool in self.tools or ()],
            "auto" if choice is None else choice.chat_choice(),
            choice is None or not choice.disable_parallel_tool_use,
            template_kwargs=None if self.thinking is None else {"enable_thinking": self.thinking.type != "disabled"},
            reasoning_budget=None
            if self.thinking is None or self.thinking.type != "enabled"
            else self.thinking.budget_tokens,
        )


class MessagesRequest(_Conversation):
    """``POST /v1/messages``: the reply to ``messages``, formatted with the model's chat
    template. Sampling values left out are llama.cpp's, as for the chat endpoint."""

    max_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)]
    stop_sequences: (
        Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES)] | None
    ) = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    stream: bool = False
    metadata: Metadata | None = None

    def sampling(self) -> SamplingBody:
        """The sampling and stop strings of the chat endpoint's body with these values."""
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "stop": self.stop_sequences}
        return SamplingBody.model_validate({name: value for name, value in given.items() if value is not None})


class CountTokensRequest(_Conversation):
    """``POST /v1/messages/count_tokens``: the tokens of the prompt ``/v1/messages`` would read."""
