"""The parts of llama.cpp's ``unit/test_tool_call.py`` that run on any model: a required tool is
called (its name, arguments that parse and hold the required key, no content), and no tool is
called without tools, with ``tool_choice: "none"`` or after a tool's result; streamed and not.
llama.cpp runs them on a tiny model with other models' templates, which format tool calls; ours
keep the served model's own, which has no tool format (llamactx then constrains the reply to its
JSON tool-call protocol). Its tests of ``"auto"`` that expect no call are left out: on such a
template the reply is JSON, a call or text, and which is the model's choice. Replies are greedy
(llama.cpp's sample where no call is expected), so that each is the same on every run."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from .streams import chat_reply

TEST_TOOL = {
    "type": "function",
    "function": {
        "name": "test",
        "description": "",
        "parameters": {
            "type": "object",
            "properties": {"success": {"type": "boolean", "const": True}},
            "required": ["success"],
        },
    },
}
PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Runs code in an ipython interpreter and returns the result of the execution after 60 seconds.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to run in the ipython interpreter."}},
            "required": ["code"],
        },
    },
}
CALCULATE_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "A calculator function that computes values of arithmetic expressions in the Python syntax",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "An arithmetic expression"}},
            "required": ["expression"],
        },
    },
}
CODING = [
    {"role": "system", "content": "You are a coding assistant."},
    {"role": "user", "content": "Write an example"},
]
STREAMS = pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])


@STREAMS
@pytest.mark.parametrize(("tool", "argument"), [(TEST_TOOL, "success"), (PYTHON_TOOL, "code")], ids=["test", "python"])
def test_completion_with_required_tool(http: httpx.Client, tool: dict[str, Any], argument: str, stream: bool) -> None:
    body = {
        "max_tokens": 64,
        "messages": CODING,
        "tool_choice": "required",
        "tools": [tool],
        "parallel_tool_calls": False,
        "stream": stream,
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
    }
    choice = chat_reply(http, body)["choices"][0]
    calls = choice["message"].get("tool_calls")
    assert calls is not None, choice["message"]
    assert len(calls) == 1, choice["message"]
    assert choice["message"].get("content") in (None, ""), choice["message"]
    assert calls[0]["function"]["name"] == tool["function"]["name"]
    arguments = calls[0]["function"]["arguments"]
    assert isinstance(arguments, str)
    assert argument in json.loads(arguments)


@STREAMS
@pytest.mark.parametrize(
    ("tools", "tool_choice"), [([], None), ([PYTHON_TOOL], "none")], ids=["no-tools", "tool-choice-none"]
)
def test_completion_without_tool_call(
    http: httpx.Client, tools: list[dict[str, Any]], tool_choice: str | None, stream: bool
) -> None:
    body: dict[str, Any] = {
        "max_tokens": 16,
        "messages": [
            {"role": "system", "content": "You are a coding assistant."},
            {"role": "user", "content": "say hello world with python"},
        ],
        "stream": stream,
        "temperature": 0,
    }
    if tools:
        body["tools"] = tools
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    choice = chat_reply(http, body)["choices"][0]
    assert choice["message"].get("tool_calls") is None, choice["message"]
    assert choice["message"]["content"]


@STREAMS
def test_calc_result(http: httpx.Client, stream: bool) -> None:
    """A tool's result sent back: the reply is text. llama.cpp's test expects its model to read
    the number out; ours asks ``tool_choice: "none"`` (with ``"auto"``, a template without tool
    calls leaves the choice to the model) and checks that the reply is text."""
    body = {
        "max_tokens": 16,
        "messages": [
            {
                "role": "system",
                "content": "You are a tools-calling assistant. You express numerical values with at most two decimals.",
            },
            {"role": "user", "content": "What's the y coordinate of a point on the unit sphere at angle 30 degrees?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_6789",
                        "type": "function",
                        "function": {"name": "calculate", "arguments": '{"expression":"sin(30 * pi / 180)"}'},
                    }
                ],
            },
            {"role": "tool", "name": "calculate", "content": "0.55644242476", "tool_call_id": "call_6789"},
        ],
        "tools": [CALCULATE_TOOL],
        "tool_choice": "none",
        "stream": stream,
        "temperature": 0,
    }
    message = chat_reply(http, body)["choices"][0]["message"]
    assert message.get("tool_calls") is None, message
    assert message["content"]
