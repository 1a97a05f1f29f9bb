"""The OpenAI-compatible parts of llama.cpp's ``unit/test_completion.py``, on
``/v1/completions``: its tests of llama-server's own ``/completion`` asked of OpenAI's route
where OpenAI has the same parameter (``max_tokens`` for ``n_predict``, ``logprobs`` for
``n_probs``). Where they match their model's words, these compare replies with each other
(streamed and whole, seeded and repeated) or check what holds for any model."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

import llamactx

from .conftest import N_CTX_SEQ
from .markers import llamactx_lacks
from .streams import streamed
from .tokens import text_tokens

MEANING = "I believe the meaning of life is"
LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore "
    "magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo "
    "consequat."
)
#: The room a prompt leaves in its request's share of the context, in the context-filling test.
ROOM = 16


def complete(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


def test_completion_with_openai_library(api: openai.OpenAI, vocab: llamactx.LlamaModel) -> None:
    reply = api.completions.create(model="davinci-002", prompt=MEANING, max_tokens=8, temperature=0)
    assert reply.system_fingerprint
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].text
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(text_tokens(vocab, MEANING)), 8)


def test_completion_stream_with_openai_library(api: openai.OpenAI) -> None:
    # llama.cpp matches its model's words; under greedy decoding the stream must equal the reply.
    options: dict[str, Any] = {"model": "davinci-002", "prompt": MEANING, "max_tokens": 8, "temperature": 0}
    text = ""
    for chunk in api.completions.create(stream=True, **options):
        choice = chunk.choices[0]
        if choice.finish_reason is None:
            assert choice.text is not None
            text += choice.text
    assert text
    assert text == api.completions.create(**options).choices[0].text


def test_completion_stream_vs_non_stream(http: httpx.Client) -> None:
    body = {"max_tokens": 8, "prompt": MEANING, "temperature": 0}
    pieces = [chunk["choices"][0]["text"] for chunk in streamed(http, "/v1/completions", body) if chunk["choices"]]
    assert "".join(pieces) == complete(http, body)["choices"][0]["text"]


def test_consistent_result_same_seed(http: httpx.Client) -> None:
    # llama.cpp's test is greedy; a seeded sample must repeat as well.
    body = {"max_tokens": 8, "prompt": MEANING, "seed": 42, "temperature": 1.0}
    texts = {complete(http, body)["choices"][0]["text"] for _ in range(3)}
    assert len(texts) == 1


def test_different_result_different_seed(http: httpx.Client) -> None:
    texts = [
        complete(http, {"max_tokens": 8, "prompt": MEANING, "seed": seed, "temperature": 1.0}) for seed in range(4)
    ]
    replies = [reply["choices"][0]["text"] for reply in texts]
    assert all(one != other for one, other in itertools.pairwise(replies))


def test_long_prompt_is_400(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json={"prompt": MEANING * 200, "seed": 42, "temperature": 1.0})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["n_ctx"] == N_CTX_SEQ


@pytest.mark.parametrize(
    "form",
    [
        "ids",
        "lists-of-ids",
        pytest.param("ids-and-text", marks=llamactx_lacks("prompts that mix token ids and texts (OpenAI has none)")),
        pytest.param("ids-in-text", marks=llamactx_lacks("prompts that mix token ids and texts (OpenAI has none)")),
    ],
)
def test_completion_with_tokens_input(http: httpx.Client, vocab: llamactx.LlamaModel, form: str) -> None:
    # llama.cpp asks its server's /tokenize; the served model's tokenizer is here.
    ids = text_tokens(vocab, MEANING)
    prompt = {
        "ids": ids,
        "lists-of-ids": [ids, ids],
        "ids-and-text": [ids, MEANING],
        "ids-in-text": [1, 2, 3, 4, 5, 6, MEANING, 7, 8, 9, 10, MEANING],
    }[form]
    choices = complete(http, {"prompt": prompt, "max_tokens": 8, "temperature": 0})["choices"]
    assert all(isinstance(choice["text"], str) for choice in choices)
    if form in ("lists-of-ids", "ids-and-text"):
        assert len(choices) == 2
        assert choices[0]["text"] == choices[1]["text"]


def test_completion_parallel_requests(http: httpx.Client) -> None:
    # llama.cpp also counts busy slots on /slots (its own route); and checks only the replies' length.
    prompts = ["Write a very long book.", "Write another a poem.", "What is LLM?", "The sky is blue and I love it."]

    def one(prompt: str) -> httpx.Response:
        return http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "seed": 42, "temperature": 1.0})

    with ThreadPoolExecutor(len(prompts)) as pool:
        responses = list(pool.map(one, prompts))
    for response in responses:
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_logprobs(http: httpx.Client, stream: bool) -> None:
    """llama.cpp's ``n_probs`` tests, with OpenAI's ``logprobs``: each token's log-probability
    and the most likely tokens at its position."""
    body = {"prompt": MEANING, "logprobs": 10, "temperature": 0, "max_tokens": 5}
    if stream:
        chunks = [chunk["choices"][0] for chunk in streamed(http, "/v1/completions", body) if chunk["choices"]]
        per_token = [choice["logprobs"] for choice in chunks if choice["finish_reason"] is None]
        tokens = [token for logprobs in per_token for token in logprobs["tokens"]]
        logprobs = [value for entry in per_token for value in entry["token_logprobs"]]
        tops = [top for entry in per_token for top in entry["top_logprobs"]]
        text = "".join(choice["text"] for choice in chunks)
    else:
        choice = complete(http, body)["choices"][0]
        tokens = choice["logprobs"]["tokens"]
        logprobs = choice["logprobs"]["token_logprobs"]
        tops = choice["logprobs"]["top_logprobs"]
        text = choice["text"]
    assert len(tokens) == len(logprobs) == len(tops) == 5
    assert "".join(tokens) == text
    assert all(value <= 0.0 for value in logprobs)
    for top in tops:
        # OpenAI's top_logprobs map token texts: tokens of the same text share an entry.
        assert 1 <= len(top) <= 10
        assert all(value <= 0.0 for value in top.values())


@pytest.mark.parametrize(
    "keys",
    ["token-ids", pytest.param("texts", marks=llamactx_lacks("llama-server's logit_bias keyed by text"))],
)
def test_logit_bias(http: httpx.Client, vocab: llamactx.LlamaModel, keys: str) -> None:
    exclude = ["i", "I", "the", "The", "to", "a", "an", "be", "is", "was", "but", "But", "and", "And", "so", "So"]
    exclude += ["you", "You", "he", "He", "she", "She", "we", "We", "they", "They", "it", "It", "his", "His"]
    exclude += ["her", "Her", "book", "Book"]
    if keys == "texts":
        bias = {f" {word} ": -100 for word in exclude}
    else:
        bias = {str(token): -100 for token in text_tokens(vocab, " " + " ".join(exclude) + " ")}
    body = {"max_tokens": 64, "prompt": "What is the best book", "logit_bias": bias, "temperature": 0}
    text = complete(http, body)["choices"][0]["text"]
    assert all(f" {word} " not in text for word in exclude)


def test_ctx_shift_disabled_stream(http: httpx.Client, vocab: llamactx.LlamaModel) -> None:
    """llama.cpp's ``unit/test_ctx_shift.py``, its OpenAI part: without context shift (both
    servers' default), a reply asked for more tokens than its share of the context has room for
    fills it, prompt and reply together as many tokens as the share (as llama.cpp's tests count
    them), and ends with "length". The end of generation is banned, so that any model fills it."""
    prompt = (text_tokens(vocab, LOREM) * N_CTX_SEQ)[: N_CTX_SEQ - ROOM]
    bans = {str(token): -100 for token in range(vocab.n_vocab()) if vocab.is_eog_token(token)}
    body = {
        "prompt": prompt,
        "max_tokens": 256,
        "temperature": 0,
        "logit_bias": bans,
        "stream_options": {"include_usage": True},
    }
    chunks = streamed(http, "/v1/completions", body)
    *pieces, last = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
    assert all(piece["finish_reason"] is None for piece in pieces)
    assert "".join(piece["text"] for piece in pieces)
    assert last["finish_reason"] == "length"
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] == N_CTX_SEQ - ROOM
    assert usage["prompt_tokens"] + usage["completion_tokens"] == N_CTX_SEQ
