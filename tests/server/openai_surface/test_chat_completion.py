"""llama.cpp's ``unit/test_chat_completion.py``, adapted: where it matches its model's words
(regexes on a TinyLlama's stories) or exact token counts, these tests assert what holds for any
model: a non-empty reply, the finish reason and token counts that agree with ``max_tokens`` and
with the prompt as the model's template renders it, and a streamed reply equal to the whole one
under greedy decoding. Greedy (``temperature: 0``) is added wherever a reply is compared."""

from __future__ import annotations

import re
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionTokenLogprob

import llamactx

from .conftest import N_CTX_SEQ
from .markers import llamactx_lacks
from .streams import streamed
from .tokens import chat_tokens, text_tokens

BOOK: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Book"},
    {"role": "user", "content": "What is the best book"},
]
BOOK_IN_PARTS = [
    {"role": "system", "content": "Book"},
    {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "the best book"}]},
]
CODING = [
    {"role": "system", "content": "You are a coding assistant."},
    {"role": "user", "content": "Write an example"},
]
USER_TEST = {"role": "user", "content": "test"}
#: A chat too long for one request's share of the context.
TOO_LONG = BOOK * 100
#: llama-server continues a last assistant message; OpenAI (and llamactx) take it as a finished turn.
PREFILL = "llama-server's assistant prefill (OpenAI takes a last assistant message as a finished turn)"


@pytest.mark.parametrize(
    ("model", "messages"),
    [(None, BOOK), ("codellama70b", BOOK), (None, BOOK_IN_PARTS), ("gpt-4o", BOOK_IN_PARTS)],
    ids=["no-model", "any-model", "text-parts", "text-parts-any-model"],
)
def test_chat_completion(
    http: httpx.Client, vocab: llamactx.LlamaModel, model: str | None, messages: list[dict[str, Any]]
) -> None:
    body: dict[str, Any] = {"max_tokens": 8, "temperature": 0, "messages": messages}
    if model is not None:
        body["model"] = model
    response = http.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    reply = response.json()
    assert "cmpl" in reply["id"]
    # llama.cpp's fingerprint is its build ("b1234"); any non-empty one will do.
    assert isinstance(reply["system_fingerprint"], str)
    assert reply["system_fingerprint"]
    usage = reply["usage"]
    if messages == BOOK:  # how text parts are joined is each server's own (llama-server's: with "\n")
        assert usage["prompt_tokens"] == chat_tokens(vocab, messages)
    assert usage["completion_tokens"] == 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    choice = reply["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"]
    assert choice["finish_reason"] == "length"


@pytest.mark.parametrize("messages", [BOOK, CODING], ids=["book", "coding"])
def test_chat_completion_stream(http: httpx.Client, vocab: llamactx.LlamaModel, messages: list[dict[str, Any]]) -> None:
    body = {"max_tokens": 16, "temperature": 0, "messages": messages, "stream_options": {"include_usage": True}}
    chunks = streamed(http, "/chat/completions", body)
    whole = http.post("/chat/completions", json=body).json()
    first, *rest = [chunk for chunk in chunks if chunk["choices"]]
    # The first chunk gives the role, without content: OpenAI's has "content": "", llama.cpp's null.
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert first["choices"][0]["delta"].get("content") in (None, "")
    assert {chunk["id"] for chunk in chunks} == {first["id"]}
    assert {chunk["model"] for chunk in chunks} == {first["model"]}
    assert all(chunk["system_fingerprint"] for chunk in chunks)
    content = first["choices"][0]["delta"].get("content") or ""
    for chunk in rest:
        choice = chunk["choices"][0]
        assert "role" not in choice["delta"]
        if choice["finish_reason"] is None:
            content += choice["delta"]["content"] or ""
        else:
            assert choice["finish_reason"] == whole["choices"][0]["finish_reason"]
            assert not choice["delta"].get("content")
    assert rest[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert content == whole["choices"][0]["message"]["content"]
    (usage,) = [chunk["usage"] for chunk in chunks if not chunk["choices"]]
    assert usage["prompt_tokens"] == whole["usage"]["prompt_tokens"] == chat_tokens(vocab, messages)
    assert usage["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_chat_completion_with_openai_library(api: openai.OpenAI) -> None:
    reply = api.chat.completions.create(
        model="gpt-3.5-turbo-instruct", messages=BOOK, max_tokens=8, seed=42, temperature=0.8
    )
    assert reply.system_fingerprint
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content
    # A seeded sample repeats (where llama.cpp's test matches its model's words).
    again = api.chat.completions.create(
        model="gpt-3.5-turbo-instruct", messages=BOOK, max_tokens=8, seed=42, temperature=0.8
    )
    assert again.choices[0].message.content == reply.choices[0].message.content


@llamactx_lacks(PREFILL)
@pytest.mark.parametrize(
    "prefill", ["Whill", [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]], ids=["text", "parts"]
)
def test_chat_template_assistant_prefill(http: httpx.Client, vocab: llamactx.LlamaModel, prefill: Any) -> None:
    # llama.cpp checks the rendered prompt in its debug output; the prompt's token count says the
    # same here: the reply continues the last assistant message, without a new turn.
    body = {"max_tokens": 8, "temperature": 0, "messages": [*BOOK, {"role": "assistant", "content": prefill}]}
    response = http.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == chat_tokens(vocab, BOOK, prefill="Whill")


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [
        ({"type": "json_object", "schema": {"const": "42"}}, '"42"'),
        ({"type": "json_schema", "json_schema": {"schema": {"const": "foooooo"}}}, '"foooooo"'),
        # llama.cpp matches its model's words here; how the JSON opens is the schema's for any model.
        pytest.param(
            {"type": "json_object", "schema": {"items": [{"type": "integer"}]}},
            r"\[.*",
            marks=llamactx_lacks("draft-4 tuple items, a list of schemas (JSON Schema 2020-12 has prefixItems)"),
        ),
        ({"type": "json_object"}, r"\{.*"),
    ],
    ids=["json-object-schema", "json-schema", "tuple-items", "json-object"],
)
def test_completion_with_response_format(http: httpx.Client, response_format: dict[str, Any], expected: str) -> None:
    body = {"max_tokens": 10, "temperature": 0, "messages": CODING, "response_format": response_format}
    response = http.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["message"]["content"]
    assert re.fullmatch(expected, content.strip(), re.DOTALL), content


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "sound"},
        {"type": "json_object", "schema": 123},
        {"type": "json_object", "schema": {"type": 123}},
        {"type": "json_object", "schema": {"type": "hiccup"}},
    ],
    ids=["unknown-type", "schema-not-object", "schema-type-not-string", "schema-type-unknown"],
)
def test_invalid_response_format_is_400(http: httpx.Client, response_format: dict[str, Any]) -> None:
    body = {"max_tokens": 1, "messages": CODING, "response_format": response_format}
    response = http.post("/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert "error" in response.json()


@llamactx_lacks("llama-server's top-level json_schema (OpenAI's is response_format)")
def test_completion_with_json_schema(http: httpx.Client) -> None:
    body = {"max_tokens": 10, "temperature": 0, "messages": CODING, "json_schema": {"const": "42"}}
    response = http.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"].strip() == '"42"'


def test_completion_with_grammar(http: httpx.Client) -> None:
    messages = [{"role": "user", "content": "Does not matter what I say, does it?"}]
    body = {"max_tokens": 6, "temperature": 0, "messages": messages, "grammar": 'root ::= "a"{5,5}'}
    response = http.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "aaaaa"


@pytest.mark.parametrize(
    "messages",
    [
        None,
        "string",
        [123],
        [{}],
        [{"role": 123}],
        [{"role": "system", "content": 123}],
        [{"role": "system", "content": "test"}, {}],
        pytest.param(
            [USER_TEST, {"role": "assistant", "content": "test"}, {"role": "assistant", "content": "test"}],
            marks=llamactx_lacks(f"{PREFILL}, which refuses two assistant messages at the end (OpenAI takes them)"),
        ),
    ],
    ids=["none", "string", "number", "empty", "role-number", "content-number", "then-empty", "two-assistants-last"],
)
def test_invalid_chat_completion_req(http: httpx.Client, messages: Any) -> None:
    # llama.cpp's test takes 400 or 500; OpenAI answers a malformed request with 400, and so must we.
    response = http.post("/chat/completions", json={"messages": messages})
    assert response.status_code == 400, response.text
    assert "error" in response.json()


@llamactx_lacks("llama-server's timings (timings_per_token)")
def test_chat_completion_with_timings_per_token(http: httpx.Client) -> None:
    body = {
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "test"}],
        "stream_options": {"include_usage": True},
        "timings_per_token": True,
    }
    first, *rest = streamed(http, "/chat/completions", body)
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert "timings" not in first
    timings = [chunk["timings"] for chunk in rest if not chunk["choices"]]
    assert timings
    assert {"prompt_per_second", "predicted_per_second"} <= timings[-1].keys()
    assert timings[-1]["predicted_n"] <= 10


def test_logprobs(api: openai.OpenAI) -> None:
    reply = api.chat.completions.create(
        model="gpt-4o", messages=BOOK, max_tokens=5, temperature=0, logprobs=True, top_logprobs=10
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    assert_spelled_out(reply.choices[0].message.content or "", logprobs.content)


def test_logprobs_stream(api: openai.OpenAI) -> None:
    chunks = api.chat.completions.create(
        model="gpt-4o", messages=BOOK, max_tokens=5, temperature=0, logprobs=True, top_logprobs=10, stream=True
    )
    content, tokens = "", []
    for i, chunk in enumerate(chunks):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if i == 0:
            assert choice.delta.role == "assistant"
            assert not choice.delta.content
        elif choice.finish_reason is None:
            assert choice.delta.role is None
            content += choice.delta.content or ""
            assert choice.logprobs is not None
            assert choice.logprobs.content is not None
            tokens += choice.logprobs.content
    assert_spelled_out(content, tokens)


def assert_spelled_out(content: str, tokens: list[ChatCompletionTokenLogprob]) -> None:
    """The tokens' texts make ``content``, each with a log-probability, its bytes and the most
    likely tokens at its place."""
    assert content
    assert "".join(token.token for token in tokens) == content
    for token in tokens:
        assert token.logprob <= 0.0
        assert token.bytes is not None
        assert token.top_logprobs


def test_logit_bias(api: openai.OpenAI, vocab: llamactx.LlamaModel) -> None:
    # llama.cpp asks its server's /tokenize for the words' ids; the served model's tokenizer is here.
    exclude = ["i", "I", "the", "The", "to", "a", "an", "be", "is", "was", "but", "But", "and", "And", "so", "So"]
    exclude += ["you", "You", "he", "He", "she", "She", "we", "We", "they", "They", "it", "It", "his", "His"]
    exclude += ["her", "Her", "book", "Book"]
    banned = text_tokens(vocab, " " + " ".join(exclude) + " ")
    reply = api.chat.completions.create(
        model="gpt-4o",
        messages=BOOK,
        max_tokens=64,
        temperature=0,
        logit_bias={str(token): -100 for token in banned},
    )
    text = reply.choices[0].message.content
    assert text
    assert all(f" {word} " not in text for word in exclude)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_context_size_exceeded(http: httpx.Client, stream: bool) -> None:
    # llama-server's error type is "exceed_context_size_error", OpenAI's "invalid_request_error":
    # what both give is a 400 (before any event) and llama-server's numbers.
    response = http.post("/chat/completions", json={"messages": TOO_LONG, "stream": stream})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["n_prompt_tokens"] > N_CTX_SEQ
    assert error["n_ctx"] == N_CTX_SEQ


def test_context_length_exceeded_has_openais_code(http: httpx.Client) -> None:
    """Not in llama.cpp's tests: OpenAI's own error object for a prompt that does not fit."""
    response = http.post("/v1/chat/completions", json={"messages": TOO_LONG})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "context_length_exceeded")


def test_chat_completions_multiple_choices(http: httpx.Client) -> None:
    response = http.post("/chat/completions", json={"max_tokens": 8, "n": 2, "seed": 42, "messages": BOOK})
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert [choice["index"] for choice in choices] == [0, 1]
    for choice in choices:
        assert choice["message"]["role"] == "assistant"
        assert choice["message"]["content"]
        assert choice["finish_reason"] == "length"


@pytest.mark.parametrize("prefix", ["", "/v1"], ids=["root", "v1"])
def test_routes_with_and_without_v1(http: httpx.Client, prefix: str) -> None:
    """Not in llama.cpp's tests (its harness posts to both): each OpenAI route at both places."""
    models = http.get(f"{prefix}/models")
    assert models.status_code == 200, models.text
    assert models.json()["data"]
    response = http.post(f"{prefix}/chat/completions", json={"max_tokens": 2, "temperature": 0, "messages": BOOK})
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "chat.completion"
