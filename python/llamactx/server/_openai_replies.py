"""OpenAI's replies as this server writes them: completions, chat completions and their
chunks, usage, log-probabilities, embeddings and model cards. ``TypedDict``s, plain dicts for
speed: each streamed token is one."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

from llamactx import __version__
from llamactx._llamactx import Completion, LlamaModel
from llamactx.server._errors import ErrorBody
from llamactx.server._openai_protocol import StreamOptions

__all__ = [
    "ChatChoice",
    "ChatChunkChoice",
    "ChatLogprobs",
    "Choice",
    "CompletionChoice",
    "CompletionLogprobs",
    "EmbeddingList",
    "Envelope",
    "ModelCard",
    "Usage",
    "chat_logprobs",
    "completion_logprobs",
    "event",
    "total_usage",
]

#: What every reply says produced it.
SYSTEM_FINGERPRINT = f"llamactx-{__version__}"


class ModelCard(TypedDict):
    """``GET /v1/models/{id}``, and each of ``GET /v1/models``."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class PromptTokensDetails(TypedDict):
    cached_tokens: int


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TokenLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]


class ContentLogprob(TokenLogprob):
    top_logprobs: list[TokenLogprob]


class ChatLogprobs(TypedDict):
    """``choices[].logprobs`` of a chat completion or chunk."""

    content: list[ContentLogprob]
    refusal: None


class CompletionLogprobs(TypedDict):
    """``choices[].logprobs`` of a legacy completion or chunk."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(TypedDict):
    """A choice of ``text_completion``, whole or as a chunk."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class ChatChoice(TypedDict):
    """A choice of ``chat.completion``: the assistant message (OpenAI's, as the chat's parser
    returns it)."""

    index: int
    message: dict[str, Any]
    logprobs: ChatLogprobs | None
    finish_reason: str


class ChatChunkChoice(TypedDict):
    """A choice of ``chat.completion.chunk``: what its message gained."""

    index: int
    delta: dict[str, Any]
    logprobs: ChatLogprobs | None
    finish_reason: str | None


Choice = CompletionChoice | ChatChoice | ChatChunkChoice


class Chunk(TypedDict):
    """One server-sent event's object."""

    id: str
    object: str
    created: int
    model: str
    system_fingerprint: str
    choices: Sequence[Choice]


class UsageChunk(Chunk):
    """A chunk of a stream with ``include_usage``: None but in the last."""

    usage: Usage | None


class Reply(Chunk):
    """A whole ``chat.completion`` or ``text_completion``."""

    usage: Usage


class Embedding(TypedDict):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(TypedDict):
    """``POST /v1/embeddings``."""

    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class Envelope:
    """What every object of one response shares: its id, object type, model and creation time;
    and whether its stream ends with usage."""

    def __init__(self, prefix: str, object_type: str, model_id: str, stream_options: StreamOptions | None) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.object = object_type
        self.chunk_object = "chat.completion.chunk" if object_type == "chat.completion" else object_type
        self.model_id = model_id
        self.created = int(time.time())
        self.include_usage = bool(stream_options and stream_options.include_usage)

    def whole(self, choices: Sequence[Choice], usage: Usage) -> Reply:
        return {**self._chunk(choices, self.object), "usage": usage}

    def event(self, choices: Sequence[Choice], usage: Usage | None = None) -> str:
        """A server-sent event of ``choices`` (and, with ``include_usage``, ``usage``)."""
        chunk = self._chunk(choices, self.chunk_object)
        if self.include_usage:
            with_usage: UsageChunk = {**chunk, "usage": usage}
            return event(with_usage)
        return event(chunk)

    def _chunk(self, choices: Sequence[Choice], object_type: str) -> Chunk:
        return {
            "id": self.id,
            "object": object_type,
            "created": self.created,
            "model": self.model_id,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        }


def event(value: Chunk | ErrorBody) -> str:
    """``value`` as a server-sent event."""
    return f"data: {json.dumps(value, ensure_ascii=False, separators=(',', ':'))}\n\n"


def usage(prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> Usage:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def total_usage(prompts: Sequence[Completion], completions: Sequence[Completion]) -> Usage:
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


def chat_logprobs(model: LlamaModel, logprobs: Sequence[Sequence[tuple[int, float]]], top: int) -> ChatLogprobs:
    """``choices[].logprobs`` of a chat completion (or of one streamed chunk)."""

    def described(token: int, logprob: float) -> TokenLogprob:
        text, raw = _text(model, token)
        return {"token": text, "logprob": logprob, "bytes": raw}

    content: list[ContentLogprob] = [
        {**described(*entry[0]), "top_logprobs": [described(*pair) for pair in _top(entry, top)]} for entry in logprobs
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(
    model: LlamaModel, logprobs: Sequence[Sequence[tuple[int, float]]], top: int, text_offset: int
) -> CompletionLogprobs:
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
