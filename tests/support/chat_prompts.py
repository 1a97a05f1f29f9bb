"""The prompts the chat functions on a context decode, recorded instead of generated from."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import llamactx
from llamactx import _chat, _structured


def recorded_prompts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The list every later ``chat`` and ``generate_json`` on a context appends its prompt to:
    ``chat`` then replies "", and ``generate_json`` replies 1 (give it a schema 1 matches)."""
    prompts: list[Any] = []
    monkeypatch.setattr(_chat, "generate", lambda ctx, prompt, **options: prompts.append(prompt) or "")

    def record(ctx: llamactx.LlamaContext, prompt: Any, **options: Any) -> Iterator[str]:
        prompts.append(prompt)
        yield "1"
        return "stop"

    monkeypatch.setattr(_structured, "stream", record)
    return prompts
