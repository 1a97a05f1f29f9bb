"""Every chat's prompt, from one renderer: the model's Jinja chat template (llama.cpp's Jinja
engine, through the crate's ``chat`` module), which marks the spans that came from the messages
so that they are tokenized as plain text. Only the template's own text becomes control tokens:
no message can open a turn. A template Jinja cannot parse falls back to llama.cpp's built-in
template matcher, made equally safe by ``template_tokens``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from llamactx._constraints import constraint_stage
from llamactx._llamactx import (
    ChatTemplateError,
    LlamaModel,
    LlamaSampler,
    MtmdContext,
    MtmdInputChunks,
    _ChatApplied,
    _ChatTemplates,
    _check_template_variables,
)
from llamactx._media import MediaBudget, MediaPrompt, media_marker, with_media_markers
from llamactx._reasoning import Reasoning, ReplyStream
from llamactx._tools import (
    ChatInputError,
    Tool,
    ToolChoice,
    checked_messages,
    offered_functions,
    plan,
    reply_call,
    reply_message,
)

__all__ = ["ChatRenderer", "Message", "PreparedChat", "template_tokens"]

#: A chat message: ``{"role", "content"}`` (OpenAI's, ``tool_calls`` and ``tool`` results
#: included) or a ``(role, content)`` pair.
Message = Mapping[str, Any] | tuple[str, str]

#: Stands for message ``N``'s text while the built-in template is rendered: private-use
#: characters, which no template writes itself.
_SLOT = "\ue000{}\ue001"
_SLOTS = re.compile("\ue000([0-9]+)\ue001")


@dataclass(frozen=True)
class PreparedChat:
    """A chat ready to submit (``Engine.prepare_chat``): the prompt's tokens, the reply's
    constraint as a compiled sampler stage (the template's own tool-call grammar, or the JSON
    reply protocol's schema, which ``json_schema`` then holds), extra stop strings the template's
    format needs, and the parser from the generated text to OpenAI's assistant message (with
    the reply's reasoning in ``reasoning_content``, for a template whose replies reason)."""

    tokens: list[int]
    json_schema: dict[str, Any] | None
    sampler: LlamaSampler | None
    stops: list[str]
    reply: Callable[[str], dict[str, Any]]
    #: The prompt with its images, when the messages hold any (``tokens`` then holds its text).
    media: MediaPrompt | None = None
    #: The reasoning-budget sampler stage (``Reasoning.budget``), for a template whose replies
    #: reason; ``Engine.submit_prepared`` adds it to a reply that is free text.
    reasoning_budget: LlamaSampler | None = None
    #: The parser a stream splits its reasoning out with (``reply_stream``); None: a stream's
    #: text is all content.
    stream_parser: Callable[[str, bool], str] | None = None

    def reply_stream(self) -> ReplyStream:
        """The ``ReplyStream`` of one streamed reply: its reasoning split out where the
        template's replies reason; its content unless the reply is constrained to tool calls."""
        return ReplyStream(self.stream_parser, content=not self.with_tools)

    @property
    def n_tokens(self) -> int:
        """The prompt's length in tokens, as a sequence holds it: its text, and each image's or
        audio clip's tokens (its embeddings, and the model's delimiters around them)."""
        return len(self.tokens) if self.media is None else self.media.n_tokens

    @property
    def with_tools(self) -> bool:
        """Whether the reply is constrained to the tools' calls."""
        return self.sampler is not None


class ChatRenderer:
    """Renders chats for ``model`` with its own chat template, or ``template`` (Jinja source)
    instead. The template is parsed on first use, once."""

    def __init__(self, model: LlamaModel, template: str | None = None) -> None:
        self.model = model
        self._template = template
        self._templates: _ChatTemplates | None = None
        self._refused = False

    def prepare(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool] = (),
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = True,
        mtmd: MtmdContext | None = None,
        media_budget: MediaBudget = MediaBudget(),
        template_kwargs: Mapping[str, Any] | None = None,
        reasoning: Reasoning = Reasoning(),
    ) -> PreparedChat:
        """The ``PreparedChat`` for ``messages``, with ``tools`` callable. A template that formats
        tool calls itself renders the tools, constrains calls with its own grammar and parses
        them back; otherwise the tools and a JSON reply protocol go into the system turn
        (``_tools.plan``), and the messages are rendered by the same template. Image parts need
        ``mtmd``, a projector that reads images (``ValueError`` otherwise); the media are read
        under ``media_budget`` (``ChatInputError`` past it) and tokenized here, once.
        ``template_kwargs`` are further variables of the template (llama-server's
        ``chat_template_kwargs``, e.g. ``enable_thinking``); ``ValueError`` for them where the
        template does not parse (the built-in matcher that then renders has no variables).
        ``reasoning`` says how a reply's reasoning is handled, for a template whose replies
        reason; a reply constrained by the JSON reply protocol (tools the template cannot
        format) is JSON from its first token, and does not reason."""
        kwargs = None if template_kwargs is None else _template_variables(template_kwargs)
        marker = media_marker()
        messages, media = with_media_markers(checked_messages(messages), marker, mtmd, media_budget)
        templates = self._parsed()
        if templates is not None and templates.supports_tool_calls:
            return _native(
                templates, messages, tools, tool_choice, parallel_tool_calls, marker, media, kwargs, reasoning
            )
        planned = plan(messages, tools, tool_choice, parallel_tool_calls)
        prompt = None
        # Compiled once here: each submit of the chat (each choice) starts from a copy.
        # A tool's arguments are parsed from the reply, not validated: llguidance holds all of them.
        stage = constraint_stage(self.model, planned.schema, None, checked=False).sampler
        reply = partial(reply_message, schema=planned.schema)
        if templates is not None:
            turns = [{"role": role, "content": text} for role, text in planned.messages]
            applied = templates.apply(json.dumps(turns), "[]", "none", False, kwargs, reasoning.format)
            tokens, prompt = _prompt(applied, marker, media)
            if planned.schema is None:
                reasoned = partial(_reasoned_reply, applied, reply)
                return PreparedChat(tokens, None, None, [], reasoned, prompt, *_reasoned(applied, reasoning))
        elif kwargs is not None:
            unparsed = "this model's chat template cannot be parsed, so it takes no chat_template_kwargs"
            raise ChatInputError("chat_template_kwargs", unparsed)
        elif media:
            raise ValueError("this model's chat template cannot be parsed, so llamactx cannot place images in it")
        else:
            tokens = template_tokens(self.model, planned.messages, add_bos=self.model.add_bos_token())
        return PreparedChat(tokens, planned.schema, stage, [], reply, prompt)

    def _parsed(self) -> _ChatTemplates | None:
        """The Jinja templates; None when the model's own does not parse (the built-in matcher
        then renders). A template given to the renderer must parse."""
        if self._templates is None and not self._refused:
            try:
                self._templates = _ChatTemplates(self.model, self._template)
            except ChatTemplateError:
                if self._template is not None:
                    raise
                # Tried once: a refusal can cost the whole work limit.
                self._refused = True
        return self._templates


def _native(
    templates: _ChatTemplates,
    messages: Sequence[Message],
    tools: Sequence[Tool],
    tool_choice: ToolChoice,
    parallel_tool_calls: bool,
    marker: str,
    media: list[MtmdInputChunks],
    kwargs: str | None,
    reasoning: Reasoning,
) -> PreparedChat:
    """A chat through the template's own tool-call format (llama.cpp's format analysis): the
    template renders the tools, its grammar (lazy, waiting for the call's opening) keeps calls
    well-formed, and its parser reads them back. A named function is the only tool offered,
    with the choice "required". The template shows the caller's tools as given, as
    llama-server's does: llama.cpp's grammar closes every object that lists its properties
    and does not say otherwise, as ``_constraints.closed`` does."""
    mode, offered = offered_functions(tools, tool_choice)
    names = {function["name"] for function in offered}
    openai_tools = [
        {"type": "function", "function": dict(tool["function"])} for tool in tools if tool["function"]["name"] in names
    ]
    openai_messages = [_openai_message(message) for message in checked_messages(messages)]
    applied = templates.apply(
        json.dumps(openai_messages), json.dumps(openai_tools), mode, parallel_tool_calls, kwargs, reasoning.format
    )
    tokens, prompt = _prompt(applied, marker, media)
    return PreparedChat(
        tokens,
        None,
        applied.sampler(),
        applied.additional_stops(),
        partial(_parsed_reply, applied),
        prompt,
        *_reasoned(applied, reasoning),
    )


def _template_variables(template_kwargs: Mapping[str, Any]) -> str:
    """``template_kwargs`` as the JSON text the template takes, checked as rendering checks it:
    ``ChatInputError`` naming ``chat_template_kwargs`` for what it refuses."""
    kwargs = json.dumps(dict(template_kwargs))
    try:
        _check_template_variables(kwargs)
    except ValueError as error:
        raise ChatInputError("chat_template_kwargs", str(error)) from None
    return kwargs


def _reasoned(
    applied: _ChatApplied, reasoning: Reasoning
) -> tuple[LlamaSampler | None, Callable[[str, bool], str] | None]:
    """The reasoning-budget stage and the stream's parser of a rendered chat (``PreparedChat``'s
    last fields): None, None for a template whose replies do not reason."""
    if not applied.reasons:
        return None, None
    stage = None if reasoning.budget is None else applied.reasoning_budget(reasoning.budget, reasoning.budget_message)
    return stage, applied.parse if reasoning.streams_split else None


def _reasoned_reply(applied: _ChatApplied, reply: Callable[[str], dict[str, Any]], text: str) -> dict[str, Any]:
    """``reply`` (the free-text reply's message) of the content llama.cpp's parser splits from
    the reasoning, which goes into ``reasoning_content``."""
    if not applied.reasons:
        return reply(text)
    try:
        parsed = json.loads(applied.parse(text))
    except ValueError:
        return reply(text)
    message = reply(parsed.get("content") or "")
    if parsed.get("reasoning_content"):
        message["reasoning_content"] = parsed["reasoning_content"]
    return message


def _prompt(applied: _ChatApplied, marker: str, media: list[MtmdInputChunks]) -> tuple[list[int], MediaPrompt | None]:
    """The rendered prompt's tokens, and with media, the prompt they separate."""
    if not media:
        return applied.tokens(), None
    runs = applied.segments(marker)
    if len(runs) != len(media) + 1:
        raise ValueError(
            f"the chat template placed {len(runs) - 1} of {len(media)} images: it drops or repeats message text"
        )
    prompt = MediaPrompt(runs, media)
    return prompt.tokens, prompt


def _openai_message(message: Message) -> dict[str, Any]:
    if isinstance(message, tuple):
        role, content = message
        return {"role": role, "content": content}
    if "content" not in message and not message.get("tool_calls"):
        raise ChatInputError("messages", "chat message lacks 'content'")
    out = dict(message)
    if out.get("role") == "developer":
        out["role"] = "system"
    return out


def _parsed_reply(applied: _ChatApplied, text: str) -> dict[str, Any]:
    try:
        message = json.loads(applied.parse(text))
    except ValueError:
        return {"role": "assistant", "content": text}
    calls = [
        reply_call(call["function"]["name"], call["function"]["arguments"]) for call in message.get("tool_calls") or ()
    ]
    reply: dict[str, Any] = {"role": "assistant", "content": message.get("content") or (None if calls else "")}
    if calls:
        reply["tool_calls"] = calls
    if message.get("reasoning_content"):
        reply["reasoning_content"] = message["reasoning_content"]
    return reply


#: Why a rendering whose frames do not hold the messages' texts where expected is refused.
_UNSAFE_RENDERING = "the chat template renders messages in a way llamactx cannot tokenize safely"


def template_tokens(model: LlamaModel, messages: Sequence[tuple[str, str]], *, add_bos: bool = False) -> list[int]:
    """``messages`` in llama.cpp's built-in template for ``model`` (the fallback renderer), ready
    for the assistant's reply, as tokens: special tokens (``<|im_start|>``) are parsed in what the
    template writes, never in the messages' text, so no message can open a turn of its own.

    The template is rendered once with a placeholder for each text, to find where the template
    puts it, and once with the texts; a template that changes a text other than by trimming its
    whitespace is refused with ``ValueError`` (its text could not be told from the template's)."""
    prompt = model.apply_chat_template(messages, None, True)
    shaped = model.apply_chat_template(
        [(role, _SLOT.format(index) if text else text) for index, (role, text) in enumerate(messages)], None, True
    )
    pieces = _SLOTS.split(shaped)
    tokens: list[int] = []
    at = 0
    for number in range(0, len(pieces) - 1, 2):
        frame, text = pieces[number], messages[int(pieces[number + 1])][1]
        if not prompt.startswith(frame, at):
            raise ValueError(_UNSAFE_RENDERING)
        at += len(frame)
        text = _as_rendered(prompt, at, text, pieces[number + 2])
        tokens += model.str_to_token(frame, add_bos and not tokens)
        tokens += model.str_to_token(text, add_bos and not tokens, special=False)
        at += len(text)
    if prompt[at:] != pieces[-1]:
        raise ValueError(_UNSAFE_RENDERING)
    return tokens + model.str_to_token(pieces[-1], add_bos and not tokens)


def _as_rendered(prompt: str, at: int, text: str, frame_after: str) -> str:
    """``text`` as the template wrote it at ``at`` of ``prompt``: whole, or without the
    whitespace some templates trim."""
    for shown in (text, text.strip(), text.lstrip(), text.rstrip()):
        if prompt.startswith(shown, at) and prompt.startswith(frame_after, at + len(shown)):
            return shown
    raise ValueError("the chat template changes message text: its special tokens could not be told from the text's")
