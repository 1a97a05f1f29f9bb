"""OpenAI's response objects built from the engine's results: choices, usage, log-probabilities
(chat and legacy completion shapes) and errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llamactx._llamactx import Completion, LlamaModel

__all__ = ["ApiError", "chat_logprobs", "completion_logprobs", "total_usage", "usage"]

JSON = dict[str, Any]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class ApiError(Exception):
    """A failure the client should see as ``{"error": {...}}`` with ``status``."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, retry_after: int = 0
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> JSON:
        return {
            "error": {
                "message": self.message,
                "type": _ERROR_TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after else {}


def usage(prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> JSON:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def total_usage(prompts: Sequence[Completion], completions: Sequence[Completion]) -> JSON:
    """Usage of a response: each prompt counted once (``n`` choices share it), every choice's
    generated tokens."""
    return usage(
        sum(c.prompt_tokens for c in prompts),
        sum(c.cached_tokens for c in prompts),
        sum(c.completion_tokens for c in completions),
    )


def _top(entry: Sequence[tuple[int, float]], count: int) -> list[tuple[int, float]]:
    """The ``count`` most likely tokens: the engine gives the chosen token, then the most
    likely others."""
    return sorted(entry, key=lambda pair: -pair[1])[:count]


def _text(model: LlamaModel, token: int) -> tuple[str, list[int]]:
    raw = model.token_to_bytes(token, True)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(model: LlamaModel, logprobs: Sequence[Sequence[tuple[int, float]]], top: int) -> JSON:
    """``choices[].logprobs`` of a chat completion (or of one streamed chunk)."""

    def described(token: int, logprob: float) -> JSON:
        text, raw = _text(model, token)
        return {"token": text, "logprob": logprob, "bytes": raw}

    content = [
        {**described(*entry[0]), "top_logprobs": [described(*pair) for pair in _top(entry, top)]} for entry in logprobs
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(
    model: LlamaModel, logprobs: Sequence[Sequence[tuple[int, float]]], top: int, text_offset: int
) -> JSON:
    """``choices[].logprobs`` of a legacy completion: tokens, their log-probabilities, the
    ``top`` most likely per position and where each token's text starts."""
    tokens, offsets = [], []
    for entry in logprobs:
        text, _ = _text(model, entry[0][0])
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [entry[0][1] for entry in logprobs],
        "top_logprobs": [{_text(model, token)[0]: lp for token, lp in _top(entry, top)} for entry in logprobs],
        "text_offset": offsets,
    }
