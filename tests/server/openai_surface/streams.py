"""Server-sent events as the tests read them, and a streamed chat gathered into the reply a
non-streamed request gets (what llama.cpp's harness does for its tool-call tests)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx


def events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON objects of a streamed response's ``data:`` lines, up to ``[DONE]``; a response
    that is not a stream fails with its status and body."""
    assert response.status_code == 200, (response.status_code, response.read())
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, and the ``event:`` lines of Anthropic's streams
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def streamed(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event of ``POST path`` with ``body`` and ``stream: true``."""
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        return list(events(response))


def chat_reply(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/chat/completions``, streamed or not as ``body`` says, as a whole
    ``chat.completion``: a stream's deltas are joined (content, and tool calls by index)."""
    if not body.get("stream"):
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        reply: dict[str, Any] = response.json()
        return reply
    message: dict[str, Any] = {"role": "assistant", "content": None}
    calls: dict[int, dict[str, Any]] = {}
    finish_reason = None
    for chunk in streamed(http, "/v1/chat/completions", body):
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("content"):
                message["content"] = (message["content"] or "") + delta["content"]
            for part in delta.get("tool_calls") or ():
                call = calls.setdefault(part["index"], {"type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = part.get("id") or call.get("id")
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
            finish_reason = choice.get("finish_reason") or finish_reason
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}
