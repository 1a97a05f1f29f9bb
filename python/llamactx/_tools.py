"""Tool calls, OpenAI's ``tools`` / ``tool_choice`` / ``parallel_tool_calls``, on any model: the
tools and a reply protocol go into the system prompt, and the reply is constrained (by a JSON
Schema, through llguidance) to a JSON object that either calls tools with arguments matching
their parameters or answers in ``content``. A call is therefore always parseable, and
``tool_choice="required"`` or a named function always yields one."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llamactx._constraints import closed

__all__ = [
    "ChatInputError",
    "Tool",
    "ToolChoice",
    "ToolPlan",
    "checked_messages",
    "offered_functions",
    "plan",
    "reply_call",
    "reply_message",
    "turns",
]

#: OpenAI's tool: ``{"type": "function", "function": {"name", "description", "parameters"}}``.
Tool = Mapping[str, Any]
#: ``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}``.
ToolChoice = Literal["none", "auto", "required"] | Mapping[str, Any]

_CALLS_START = '{"tool_calls": ['

#: The most calls one reply makes (a small model repeats a call until its tokens run out).
MAX_CALLS = 8

_INSTRUCTIONS = {
    "auto": 'To call tools, reply with {"tool_calls": [{"name": ..., "arguments": {...}}]}; '
    'to answer the user directly, reply with {"content": "your answer"}.',
    "required": 'Call a tool now: reply with {"tool_calls": [{"name": ..., "arguments": {...}}]}.',
}


class ChatInputError(ValueError):
    """A malformed message, tool, ``tool_choice`` or template variable: ``param`` says which
    (``"messages"``, ``"tools"``, ``"tool_choice"`` or ``"chat_template_kwargs"``), for the
    server's error object."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def checked_messages(messages: object) -> list[Mapping[str, Any] | tuple[str, str]]:
    """``messages`` as a list, each checked to be a ``(role, content)`` pair of strings or a dict
    with a string ``role``, whose ``tool_calls`` (if any) each name a ``function``. ``TypeError``
    or ``ValueError`` naming the message otherwise."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of chat messages, not {type(messages).__name__}")
    checked: list[Mapping[str, Any] | tuple[str, str]] = []
    for index, message in enumerate(messages):
        if isinstance(message, tuple):
            if len(message) != 2 or not all(isinstance(part, str) for part in message):
                raise TypeError(f"messages[{index}] as a pair must be (role, content), two strings: {message!r}")
        elif isinstance(message, Mapping):
            _check_message(index, message)
        else:
            raise TypeError(
                f"messages[{index}] must be a dict with 'role' and 'content' or a (role, content) pair, "
                f"not {type(message).__name__}"
            )
        checked.append(message)
    return checked


def _check_message(index: int, message: Mapping[str, Any]) -> None:
    if not isinstance(message.get("role"), str):
        raise ChatInputError("messages", f"messages[{index}] needs a 'role' string: {message!r}")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if isinstance(calls, str | bytes | Mapping) or not isinstance(calls, Sequence):
        raise TypeError(f"messages[{index}].tool_calls must be a list, not {type(calls).__name__}")
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ChatInputError(
                "messages",
                f'messages[{index}].tool_calls[{number}] must be {{"function": {{"name": ..., "arguments": ...}}}}, '
                f"got {call!r}",
            )


@dataclass(frozen=True)
class ToolPlan:
    """How a chat with tools is generated: the messages to format with the chat template, and
    the JSON Schema the reply must match (None: free text, as without tools)."""

    messages: list[tuple[str, str]]
    schema: dict[str, Any] | None


def plan(
    messages: Sequence[Mapping[str, Any] | tuple[str, str]],
    tools: Sequence[Tool],
    tool_choice: ToolChoice = "auto",
    parallel_tool_calls: bool = True,
) -> ToolPlan:
    """The ``ToolPlan`` for a conversation. Earlier assistant tool calls are shown in the reply
    protocol and ``tool`` results keep their role. ``ValueError`` for a malformed tool, an
    unknown ``tool_choice`` or a named function that is not among ``tools``."""
    mode, offered = offered_functions(tools, tool_choice)
    history = turns(messages)
    if mode == "none" or not offered:
        return ToolPlan(history, None)
    system = "You can call these tools:\n" + json.dumps(offered) + "\n" + _INSTRUCTIONS[mode]
    if history and history[0][0] == "system":
        history[0] = ("system", history[0][1] + "\n\n" + system)
    else:
        history.insert(0, ("system", system))
    # Each tool's parameters live under the root's $defs, their own references rebased there.
    defined = {f"parameters_{index}": function for index, function in enumerate(offered)}
    call_schemas = [_call_schema(function["name"], f"#/$defs/{key}") for key, function in defined.items()]
    calls: dict[str, Any] = {"type": "array", "items": {"anyOf": call_schemas}, "minItems": 1}
    calls["maxItems"] = MAX_CALLS if parallel_tool_calls else 1
    call_reply = _object({"tool_calls": calls})
    schema: dict[str, Any] = (
        call_reply if mode == "required" else {"anyOf": [call_reply, _object({"content": {"type": "string"}})]}
    )
    schema["$defs"] = {key: _rebased(function["parameters"], f"#/$defs/{key}") for key, function in defined.items()}
    return ToolPlan(history, schema)


def reply_message(text: str, schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """OpenAI's assistant message for a reply generated under ``schema`` (a plan's; None: the
    text is the content): ``content`` and, for calls, ``tool_calls`` with fresh ids and the
    arguments as JSON text. A reply that ``max_tokens`` cut keeps the calls it completed, or
    else comes back as its text in ``content``."""
    if schema is None:
        return {"role": "assistant", "content": text}
    try:
        reply = json.loads(text)
    except ValueError:
        reply = {"tool_calls": _completed_calls(text)}
        if not reply["tool_calls"]:
            return {"role": "assistant", "content": text}
    if "tool_calls" not in reply:
        return {"role": "assistant", "content": reply["content"]}
    calls = [reply_call(call["name"], json.dumps(call["arguments"])) for call in reply["tool_calls"]]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def reply_call(name: str, arguments: str) -> dict[str, Any]:
    """OpenAI's tool call in a reply, with a fresh id (no format carries one)."""
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _completed_calls(text: str) -> list[Any]:
    """The calls a cut reply completed: the constraint lets a call's object close only once it
    is valid, and lays the reply out as ``{"tool_calls": [CALL, CALL, ...``."""
    if not text.startswith(_CALLS_START):
        return []
    decoder = json.JSONDecoder()
    calls: list[Any] = []
    at = len(_CALLS_START)
    while True:
        try:
            call, at = decoder.raw_decode(text, at)
        except ValueError:
            return calls
        calls.append(call)
        if not text.startswith(", ", at):
            return calls
        at += 2


def offered_functions(tools: Sequence[Tool], tool_choice: ToolChoice) -> tuple[str, list[dict[str, Any]]]:
    """The mode ("none", "auto" or "required") and the functions offered to the model: all of
    ``tools``, or the one ``tool_choice`` names (the mode is then "required"). ``TypeError`` /
    ``ValueError`` for malformed tools, duplicate names or an unknown ``tool_choice``."""
    functions = _functions(tools)
    names = [function["name"] for function in functions]
    if len(set(names)) != len(names):
        raise ChatInputError("tools", f"tool names must be unique, got {names}")
    mode, chosen = _choice(tool_choice, names)
    return mode, [function for function in functions if chosen is None or function["name"] == chosen]


def _functions(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence):
        raise TypeError(f"tools must be a list of OpenAI function tools, not {type(tools).__name__}")
    return [_function(tool) for tool in tools]


def _function(tool: Tool) -> dict[str, Any]:
    if not isinstance(tool, Mapping):
        raise TypeError(f'a tool is {{"type": "function", "function": {{"name": ...}}}}, not {type(tool).__name__}')
    function = tool.get("function") if tool.get("type") == "function" else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ChatInputError("tools", f'a tool is {{"type": "function", "function": {{"name": ...}}}}, got {tool!r}')
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, Mapping):
        raise ChatInputError("tools", f"the parameters of tool {function['name']!r} must be a JSON Schema object")
    # Unknown arguments would break the call: objects are closed unless they say otherwise.
    described = {"name": function["name"], "parameters": closed(dict(parameters))}
    if function.get("description"):
        described["description"] = str(function["description"])
    return described


def _choice(tool_choice: ToolChoice, names: list[str]) -> tuple[str, str | None]:
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise ChatInputError(
                "tool_choice", f'tool_choice is "none", "auto", "required" or a named function, got {tool_choice!r}'
            )
        return tool_choice, None
    if not isinstance(tool_choice, Mapping):
        raise TypeError(
            f'tool_choice is "none", "auto", "required" or a named function, not {type(tool_choice).__name__}'
        )
    function = tool_choice.get("function") if tool_choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if name not in names:
        raise ChatInputError(
            "tool_choice", f"tool_choice names a function that is not among the tools: {tool_choice!r}"
        )
    return "required", name


def _call_schema(name: str, parameters: str) -> dict[str, Any]:
    return _object({"name": {"const": name}, "arguments": {"$ref": parameters}})


def _rebased(schema: Any, base: str) -> Any:
    """``schema`` with every local ``$ref`` (``#...``) pointing into ``base`` instead of the
    document's root: a schema's references stay right wherever it is embedded."""
    if isinstance(schema, list):
        return [_rebased(item, base) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rebased = {key: _rebased(value, base) for key, value in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        rebased["$ref"] = base + ref[1:]
    return rebased


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def turns(messages: Sequence[Mapping[str, Any] | tuple[str, str]]) -> list[tuple[str, str]]:
    """The conversation as chat-template turns (``TypeError`` / ``ValueError`` naming a malformed
    message). A tool's result becomes a user turn naming the
    tool: chat templates without tool support drop or garble a ``tool`` role, and a small model
    answers from "The tool get_weather returned: ..." where it repeats its call after a bare
    result."""
    names: dict[str, str] = {}
    history = []
    for message in checked_messages(messages):
        if not isinstance(message, tuple):
            for call in message.get("tool_calls") or ():
                names[str(call.get("id"))] = call["function"]["name"]
            if message.get("role") == "tool":
                name = names.get(str(message.get("tool_call_id")))
                tool = f"The tool {name}" if name else "The tool"
                history.append(("user", f"{tool} returned: {_rendered(message)[1]}"))
                continue
        history.append(_rendered(message))
    return history


def _rendered(message: Mapping[str, Any] | tuple[str, str]) -> tuple[str, str]:
    if isinstance(message, tuple):
        return message
    role = "system" if message.get("role") == "developer" else str(message.get("role"))
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        shown = " ".join(
            f"I will call {call['function']['name']}({_arguments(call['function'].get('arguments', '{}'))})."
            for call in calls
        )
        return role, shown
    if "content" not in message:
        raise ChatInputError("messages", "chat message lacks 'content'")
    content = message["content"]
    if isinstance(content, list):  # OpenAI's text parts
        content = "".join(str(part.get("text", "")) for part in content)
    return role, "" if content is None else str(content)


def _arguments(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
