"""The OpenAI parts of llama.cpp's ``unit/test_embedding.py`` (``/v1/embeddings``), on the served
model mean-pooled (llama.cpp's tests use a BERT model, pooled as each test configures it; the
tests of other poolings are left out: the server's pooling is fixed). Token counts are the
served model's tokenizer's instead of BERT's."""

from __future__ import annotations

import base64
import struct
from typing import Any

import httpx
import openai
import pytest

import llamactx

from .markers import llamactx_lacks
from .tokens import text_tokens

EPSILON = 1e-3
MEANING = "I believe the meaning of life is"
SENTENCES = [MEANING, "Write a joke about AI from a very long prompt which will not be truncated", "This is a test"]
SENTENCES.append("This is another test")
MIXED = "inputs that mix token ids and texts (OpenAI has none)"


def embeddings(http: httpx.Client, given: Any, **options: Any) -> dict[str, Any]:
    response = http.post("/v1/embeddings", json={"input": given, **options})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_embedding_single(embeddings_http: httpx.Client) -> None:
    (datum,) = embeddings(embeddings_http, MEANING)["data"]
    assert len(datum["embedding"]) > 1
    assert abs(sum(x * x for x in datum["embedding"]) - 1) < EPSILON  # normalised


def test_embedding_multiple(embeddings_http: httpx.Client) -> None:
    data = embeddings(embeddings_http, SENTENCES)["data"]
    assert [datum["index"] for datum in data] == [0, 1, 2, 3]
    assert all(len(datum["embedding"]) > 1 for datum in data)


@pytest.mark.parametrize(
    ("given", "count"),
    [
        # llama.cpp's: "do not crash on empty input", and it answers 200; OpenAI refuses "" (400).
        pytest.param("", 1, marks=llamactx_lacks("embeddings of an empty input (OpenAI refuses it)")),
        ("string", 1),
        ([12, 34, 56], 1),
        pytest.param([12, 34, "string", 56, 78], 1, marks=llamactx_lacks(MIXED)),
        (["string1", "string2"], 2),
        pytest.param(["string1", [12, 34, 56]], 2, marks=llamactx_lacks(MIXED)),
        ([[12, 34, 56], [12, 34, 56]], 2),
        pytest.param([[12, 34, 56], [12, "string", 34, 56]], 2, marks=llamactx_lacks(MIXED)),
    ],
    ids=["empty", "text", "ids", "ids-and-text", "texts", "text-and-ids", "lists-of-ids", "ids-then-mixed"],
)
def test_embedding_mixed_input(embeddings_http: httpx.Client, given: Any, count: int) -> None:
    data = embeddings(embeddings_http, given)["data"]
    assert len(data) == count
    assert all(len(datum["embedding"]) > 1 for datum in data)


def test_embedding_openai_library_single(embeddings_api: openai.OpenAI) -> None:
    answer = embeddings_api.embeddings.create(model="text-embedding-3-small", input=MEANING)
    assert len(answer.data) == 1
    assert len(answer.data[0].embedding) > 1


def test_embedding_openai_library_multiple(embeddings_api: openai.OpenAI) -> None:
    answer = embeddings_api.embeddings.create(model="text-embedding-3-small", input=SENTENCES)
    assert len(answer.data) == 4
    assert all(len(datum.embedding) > 1 for datum in answer.data)


def test_embedding_error_prompt_too_long(embeddings_http: httpx.Client) -> None:
    # llama.cpp's test wants any error with its wording ("too large"); OpenAI's is a 400.
    response = embeddings_http.post("/v1/embeddings", json={"input": "This is a test " * 512})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"]


def test_same_prompt_give_same_result(embeddings_http: httpx.Client) -> None:
    data = embeddings(embeddings_http, [MEANING] * 5)["data"]
    first = data[0]["embedding"]
    for datum in data[1:]:
        assert all(abs(x - y) < EPSILON for x, y in zip(first, datum["embedding"], strict=True))


@pytest.mark.parametrize("content", [MEANING, "This is a test"])
def test_embedding_usage_single(embeddings_http: httpx.Client, vocab: llamactx.LlamaModel, content: str) -> None:
    usage = embeddings(embeddings_http, content)["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == len(text_tokens(vocab, content))


def test_embedding_usage_multiple(embeddings_http: httpx.Client, vocab: llamactx.LlamaModel) -> None:
    usage = embeddings(embeddings_http, [MEANING, MEANING])["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == 2 * len(text_tokens(vocab, MEANING))


def test_embedding_openai_library_base64(embeddings_http: httpx.Client) -> None:
    text = "Test base64 embedding output"
    floats = embeddings(embeddings_http, text)["data"][0]["embedding"]
    (datum,) = embeddings(embeddings_http, text, encoding_format="base64")["data"]
    assert isinstance(datum["embedding"], str)
    raw = base64.b64decode(datum["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(decoded) == len(floats)
    assert all(abs(x - y) < EPSILON for x, y in zip(decoded, floats, strict=True))
