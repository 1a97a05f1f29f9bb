"""``llamactx serve`` driven by the official ``openai`` client (sync and async, streaming and
not), with outputs checked against the in-process ``Engine`` on the same options."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import openai
import pydantic
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from support.prompts import CHATML_WITH_VARIABLES, HELPFUL, PLAIN_CHATML
from support.serving import ENGINE_OPTIONS, MODEL_ID, Server, running_server
from support.tool_examples import ASK_WEATHER, TIME, WEATHER

import llamactx
from llamactx._embedding import embedding_context
from llamactx.server import create_app

# The module takes about 50 s of a parallel worker: started first (with the other long ones),
# so that it does not run alone at the end of the pass.
pytestmark = pytest.mark.long

QUESTION = [
    {"role": "system", "content": HELPFUL},
    {"role": "user", "content": "What is the capital of France?"},
]
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]
API_KEY = "test-key-1234"


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[Server]:
    """Without the prefix cache, so outputs equal the engine's token for token."""
    with running_server(model_path, "--no-prefix-cache") as running:
        yield running


@pytest.fixture(scope="module")
def keyed_server(model_path: Path) -> Iterator[Server]:
    """With an API key, the prefix cache and embeddings."""
    with running_server(model_path, "--api-key", API_KEY, "--embeddings") as running:
        yield running


@pytest.fixture(scope="module")
def engine(model: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(model, **ENGINE_OPTIONS) as reference:
        yield reference


_clients: list[openai.OpenAI] = []


@pytest.fixture(scope="module", autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _clients:
        _clients.pop().close()


def client(server: Server, **options: Any) -> openai.OpenAI:
    """A client of ``server``, closed when the module's tests are done."""
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=options.pop("api_key", "unused"), **options)
    _clients.append(api)
    return api


def greedy_chat(engine: llamactx.Engine, messages: list[dict[str, str]], **options: Any) -> llamactx.Completion:
    return engine.submit_chat(messages, max_tokens=options.pop("max_tokens", 32), **options).result(60)


def test_models_lists_and_retrieves_the_served_model(server: Server) -> None:
    api = client(server)
    assert [card.id for card in api.models.list().data] == [MODEL_ID]
    assert api.models.retrieve(MODEL_ID).owned_by == "llamactx"
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("gpt-4o")


def test_openais_routes_are_served_without_v1_too(server: Server, keyed_server: Server) -> None:
    options: dict[str, Any] = {"model": MODEL_ID, "messages": QUESTION, "temperature": 0, "max_tokens": 8}
    with_v1 = client(server).chat.completions.create(**options)
    without = openai.OpenAI(base_url=server.url, api_key="unused")
    _clients.append(without)
    assert without.chat.completions.create(**options).choices[0].message.content == with_v1.choices[0].message.content
    whole = client(server).completions.create(model=MODEL_ID, prompt=PROMPTS[0], temperature=0, max_tokens=4)
    root = without.completions.create(model=MODEL_ID, prompt=PROMPTS[0], temperature=0, max_tokens=4)
    assert root.choices[0].text == whole.choices[0].text
    assert [card.id for card in without.models.list().data] == [MODEL_ID]
    assert without.models.retrieve(MODEL_ID).id == MODEL_ID
    keyed_root = openai.OpenAI(base_url=keyed_server.url, api_key=API_KEY)
    _clients.append(keyed_root)
    embedded = [
        api.embeddings.create(model=MODEL_ID, input="hello", encoding_format="float").data[0].embedding
        for api in (keyed_root, client(keyed_server, api_key=API_KEY))
    ]
    assert embedded[0] == embedded[1]
    route = 'llamactx_requests_total{route="/chat/completions",status="200"}'
    assert server.metrics()[route] == 1


def test_any_model_name_or_none_is_the_served_model_unless_strict(engine: llamactx.Engine) -> None:
    apps = {
        strict: create_app(engine, model_id="local", model_aliases=["gpt-4o-mini", "local"], strict_model=strict)
        for strict in (False, True)
    }
    request: dict[str, Any] = {"prompt": PROMPTS[0], "temperature": 0, "max_tokens": 2}

    async def call(strict: bool) -> dict[str, Any]:
        async with (
            httpx.AsyncClient(transport=httpx.ASGITransport(app=apps[strict]), base_url="http://test/v1") as http,
            openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http) as api,
        ):
            seen: dict[str, Any] = {"listed": [card.id for card in (await api.models.list()).data]}
            for name in ("local", "gpt-4o-mini", "gpt-4o"):
                try:
                    seen[name] = (await api.completions.create(model=name, **request)).model
                except openai.NotFoundError as error:
                    seen[name] = error.code
            nameless = (await http.post("/completions", json=request)).json()
            seen["nameless"] = nameless["model"] if "model" in nameless else nameless["error"]["param"]
            return seen

    served = {"listed": ["local", "gpt-4o-mini"], "local": "local", "gpt-4o-mini": "local"}
    assert asyncio.run(call(False)) == {**served, "gpt-4o": "local", "nameless": "local"}
    assert asyncio.run(call(True)) == {**served, "gpt-4o": "model_not_found", "nameless": "model"}


def test_serve_takes_model_aliases_and_strict_model(model_path: Path) -> None:
    options = ("--parallel", "1", "--ctx", "512", "--model-id", "local", "--model-alias", "a", "--model-alias", "b")
    with running_server(model_path, *options, "--strict-model") as strict:
        api = client(strict, max_retries=0)
        assert [card.id for card in api.models.list().data] == ["local", "a", "b"]
        assert api.completions.create(model="b", prompt="Hi", max_tokens=1).model == "local"
        with pytest.raises(openai.NotFoundError) as refused:
            api.completions.create(model="gpt-4o", prompt="Hi", max_tokens=1)
        assert refused.value.code == "model_not_found"


def test_chat_equals_the_engine_and_counts_usage(server: Server, engine: llamactx.Engine) -> None:
    reply = client(server).chat.completions.create(model=MODEL_ID, messages=QUESTION, temperature=0, max_tokens=32)
    expected = greedy_chat(engine, QUESTION)
    assert "Paris" in expected.text
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(engine.chat_tokens(QUESTION))
    assert reply.usage.completion_tokens == expected.completion_tokens
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streamed_chat_equals_the_whole_reply_and_ends_with_usage(server: Server) -> None:
    api = client(server)
    options: dict[str, Any] = {"model": MODEL_ID, "messages": QUESTION, "temperature": 0, "max_tokens": 32}
    whole = api.chat.completions.create(**options)
    chunks = list(api.chat.completions.create(**options, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.model_dump(exclude_unset=True) == {"role": "assistant"}  # no content: OpenAI's
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(chunk.usage is None for chunk in chunks[:-1])
    plain = list(api.chat.completions.create(**options, stream=True))
    assert all(chunk.usage is None for chunk in plain)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in plain) == text


def test_async_clients_at_once_get_what_one_gets_alone(server: Server, engine: llamactx.Engine) -> None:
    expected = [engine.submit(prompt, max_tokens=24).result(60).text for prompt in PROMPTS]

    async def complete_all() -> list[list[str]]:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused") as api:
            return await complete_with(api)

    async def complete_with(api: openai.AsyncOpenAI) -> list[list[str]]:
        async def streamed(prompt: str) -> str:
            stream = await api.completions.create(
                model=MODEL_ID, prompt=prompt, temperature=0, max_tokens=24, stream=True
            )
            return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

        async def whole(prompt: str) -> str:
            reply = await api.completions.create(model=MODEL_ID, prompt=prompt, temperature=0, max_tokens=24)
            return reply.choices[0].text

        rounds = [asyncio.gather(*(fetch(prompt) for prompt in PROMPTS)) for fetch in (streamed, whole) * 2]
        return list(await asyncio.gather(*rounds))

    for texts in asyncio.run(complete_all()):
        assert texts == expected


def test_completion_prompt_forms_and_n(server: Server, engine: llamactx.Engine) -> None:
    api = client(server)
    token_prompt = engine.tokens(PROMPTS[1])
    expected = [engine.submit(prompt, max_tokens=8).result(60).text for prompt in PROMPTS[:2]]
    reply = api.completions.create(model=MODEL_ID, prompt=PROMPTS[:2], temperature=0, max_tokens=8, n=2)
    assert [choice.index for choice in reply.choices] == [0, 1, 2, 3]
    assert [choice.text for choice in reply.choices] == [expected[0]] * 2 + [expected[1]] * 2
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == sum(len(engine.tokens(prompt)) for prompt in PROMPTS[:2])
    assert reply.usage.completion_tokens == 4 * 8
    by_tokens = api.completions.create(model=MODEL_ID, prompt=token_prompt, temperature=0, max_tokens=8)
    assert by_tokens.choices[0].text == expected[1]
    lists = api.completions.create(model=MODEL_ID, prompt=[token_prompt, token_prompt], temperature=0, max_tokens=8)
    assert [choice.text for choice in lists.choices] == [expected[1]] * 2
    assert reply.choices[0].finish_reason == "length"


def test_a_seed_repeats_a_sampled_reply_and_choices_differ(server: Server) -> None:
    api = client(server)
    options: dict[str, Any] = {"model": MODEL_ID, "prompt": "My favourite word is", "max_tokens": 16}
    first = api.completions.create(**options, temperature=1.0, seed=7, n=3)
    again = api.completions.create(**options, temperature=1.0, seed=7, n=3)
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len({c.text for c in first.choices}) > 1, "the n choices drew the same text"
    other = api.completions.create(**options, temperature=1.0, seed=8)
    assert other.choices[0].text == first.choices[1].text  # choice i draws with seed + i


def test_stop_strings_and_max_tokens_end_a_reply(server: Server, engine: llamactx.Engine) -> None:
    api = client(server)
    full = engine.submit(PROMPTS[0], max_tokens=32).result(60).text
    assert "\n" in full
    stopped = api.completions.create(model=MODEL_ID, prompt=PROMPTS[0], temperature=0, max_tokens=32, stop=["\n"])
    assert stopped.choices[0].text == full[: full.index("\n")]
    assert stopped.choices[0].finish_reason == "stop"
    short = api.chat.completions.create(model=MODEL_ID, messages=QUESTION, temperature=0, max_completion_tokens=3)
    assert short.choices[0].finish_reason == "length"
    assert short.usage is not None
    assert short.usage.completion_tokens == 3


def test_chat_logprobs_are_the_engines_streamed_or_not(server: Server, engine: llamactx.Engine) -> None:
    api = client(server)
    options: dict[str, Any] = {"model": MODEL_ID, "messages": QUESTION, "temperature": 0, "max_tokens": 12}
    reply = api.chat.completions.create(**options, logprobs=True, top_logprobs=3)
    expected = greedy_chat(engine, QUESTION, max_tokens=12, logprobs=3)
    assert reply.choices[0].logprobs is not None
    assert reply.choices[0].logprobs.content is not None
    content = reply.choices[0].logprobs.content
    assert [entry.token for entry in content] == [engine.model.token_to_str(t) for t in expected.tokens]
    assert "".join(entry.token for entry in content) == reply.choices[0].message.content
    for entry, engine_entry in zip(content, expected.logprobs, strict=True):
        assert entry.logprob == pytest.approx(engine_entry[0][1], abs=1e-5)
        assert bytes(entry.bytes or []) == engine.model.token_to_bytes(engine_entry[0][0])
        top = [alternative.logprob for alternative in entry.top_logprobs]
        assert len(top) == 3
        assert top == sorted(top, reverse=True)
        assert top[0] == pytest.approx(entry.logprob, abs=1e-5)  # greedy took the likeliest
    stream = api.chat.completions.create(**options, logprobs=True, top_logprobs=3, stream=True)
    streamed = [
        entry
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content or []
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]


def test_logprobs_without_alternatives(server: Server) -> None:
    api = client(server)
    chat = api.chat.completions.create(model=MODEL_ID, messages=QUESTION, temperature=0, max_tokens=4, logprobs=True)
    assert chat.choices[0].logprobs is not None
    content = chat.choices[0].logprobs.content or []
    assert len(content) == 4
    assert all(entry.top_logprobs == [] and entry.logprob <= 0 for entry in content)
    legacy = api.completions.create(model=MODEL_ID, prompt=PROMPTS[0], temperature=0, max_tokens=4, logprobs=0)
    assert legacy.choices[0].logprobs is not None
    assert len(legacy.choices[0].logprobs.token_logprobs or []) == 4
    assert legacy.choices[0].logprobs.top_logprobs == [{}] * 4


def test_completion_logprobs_have_offsets_and_top_maps(server: Server) -> None:
    reply = client(server).completions.create(
        model=MODEL_ID, prompt=PROMPTS[0], temperature=0, max_tokens=10, logprobs=2
    )
    choice = reply.choices[0]
    assert choice.logprobs is not None
    tokens = choice.logprobs.tokens or []
    assert "".join(tokens) == choice.text
    offsets = choice.logprobs.text_offset or []
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    for logprob, top in zip(choice.logprobs.token_logprobs or [], choice.logprobs.top_logprobs or [], strict=True):
        assert len(top) == 2
        assert max(top.values()) == pytest.approx(logprob, abs=1e-5)


def test_logit_bias_and_grammar_steer_the_reply(server: Server, engine: llamactx.Engine) -> None:
    api = client(server)
    first = engine.submit(PROMPTS[0], max_tokens=1).result(60).tokens[0]
    biased = api.completions.create(
        model=MODEL_ID, prompt=PROMPTS[0], temperature=0, max_tokens=1, logit_bias={str(first): -100}
    )
    assert biased.choices[0].text != engine.model.token_to_str(first)
    constrained = api.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Is Paris in France?"}],
        temperature=0,
        max_tokens=8,
        extra_body={"grammar": 'root ::= "yes" | "no"', "top_k": 5, "min_p": 0.1, "repeat_penalty": 1.1},
    )
    assert constrained.choices[0].message.content in {"yes", "no"}


def test_embeddings_float_and_base64_equal_embed(keyed_server: Server, model: llamactx.LlamaModel) -> None:
    api = client(keyed_server, api_key=API_KEY)
    texts = ["The cat sat on the mat.", "Paris is the capital of France."]
    expected = llamactx.embed(embedding_context(model, 8, 512, None), texts)
    as_floats = api.embeddings.create(model=MODEL_ID, input=texts, encoding_format="float")
    np.testing.assert_allclose([item.embedding for item in as_floats.data], expected, rtol=1e-5, atol=1e-6)
    raw = httpx.post(
        f"{keyed_server.url}/v1/embeddings",
        json={"model": MODEL_ID, "input": texts[0], "encoding_format": "base64"},
        headers={"Authorization": f"Bearer {API_KEY}"},
    ).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, expected[0], rtol=1e-5, atol=1e-6)
    assert as_floats.usage.prompt_tokens == sum(len(model.str_to_token(text, True)) for text in texts)
    default_client = api.embeddings.create(model=MODEL_ID, input=texts[1])  # the client asks for base64
    np.testing.assert_allclose(default_client.data[0].embedding, expected[1], rtol=1e-5, atol=1e-6)
    # Token ids, one input or several, as OpenAI's API takes them: the texts' own tokens.
    ids = [model.str_to_token(text, True) for text in texts]
    as_ids = api.embeddings.create(model=MODEL_ID, input=ids, encoding_format="float")
    np.testing.assert_allclose([item.embedding for item in as_ids.data], expected, rtol=1e-5, atol=1e-6)
    assert as_ids.usage.prompt_tokens == as_floats.usage.prompt_tokens
    one = api.embeddings.create(model=MODEL_ID, input=ids[1], encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, expected[1], rtol=1e-5, atol=1e-6)
    with pytest.raises(openai.BadRequestError) as refused:
        api.embeddings.create(model=MODEL_ID, input=[1, model.n_vocab()])
    assert "outside the vocabulary" in refused.value.message
    assert refused.value.param == "input"
    # `dimensions`: the model's own is served; shortening (OpenAI's text-embedding-3 models are
    # trained for it, llama.cpp's models are not) is refused, naming the parameter.
    same = api.embeddings.create(model=MODEL_ID, input=texts[0], encoding_format="float", dimensions=model.n_embd())
    np.testing.assert_allclose(same.data[0].embedding, expected[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(openai.BadRequestError) as shortened:
        api.embeddings.create(model=MODEL_ID, input=texts[0], dimensions=64)
    assert shortened.value.param == "dimensions"
    assert f"{model.n_embd()} dimensions" in shortened.value.message


def test_the_api_key_is_required_except_for_health(keyed_server: Server) -> None:
    for key in ("unused", API_KEY[:-1]):
        with pytest.raises(openai.AuthenticationError) as refused:
            client(keyed_server, api_key=key).models.list()
        assert refused.value.status_code == 401
        assert refused.value.code == "invalid_api_key"
    assert httpx.get(f"{keyed_server.url}/metrics").status_code == 401
    assert httpx.get(f"{keyed_server.url}/health").json() == {"status": "ok"}
    assert client(keyed_server, api_key=API_KEY).models.list().data[0].id == MODEL_ID


def test_a_repeated_prompt_reuses_cached_tokens(keyed_server: Server) -> None:
    api = client(keyed_server, api_key=API_KEY)
    system = {"role": "system", "content": "You are a helpful assistant who answers in one short sentence. " * 4}
    replies = [
        api.chat.completions.create(model=MODEL_ID, messages=[system, *QUESTION], temperature=0, max_tokens=8)
        for _ in range(2)
    ]
    usage = [reply.usage for reply in replies]
    assert usage[0] is not None
    assert usage[1] is not None
    assert usage[1].prompt_tokens_details is not None
    assert usage[1].prompt_tokens_details.cached_tokens
    assert usage[1].prompt_tokens_details.cached_tokens >= usage[1].prompt_tokens - 1
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content


def test_embeddings_are_off_unless_asked_for(server: Server) -> None:
    with pytest.raises(openai.NotFoundError, match="--embeddings"):
        client(server).embeddings.create(model=MODEL_ID, input="hello")


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ASK_PERSON = [{"role": "system", "content": HELPFUL}, {"role": "user", "content": "Describe a person as JSON."}]


def test_response_format_json_schema_returns_the_engines_valid_json(server: Server, engine: llamactx.Engine) -> None:
    expected = greedy_chat(engine, ASK_PERSON, max_tokens=64, json_schema=PERSON)
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    reply = client(server).chat.completions.create(
        model=MODEL_ID, messages=ASK_PERSON, temperature=0, max_tokens=64, response_format=response_format
    )
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == "stop"
    person = json.loads(expected.text)
    assert set(person) == {"name", "age"}
    assert isinstance(person["age"], int)


def test_a_nameless_json_schema_and_a_json_object_schema_constrain_as_json_schema_does(
    server: Server, engine: llamactx.Engine
) -> None:
    expected = greedy_chat(engine, ASK_PERSON, max_tokens=64, json_schema=PERSON).text
    formats: list[Any] = [
        {"type": "json_schema", "json_schema": {"schema": PERSON}},
        {"type": "json_object", "schema": PERSON},  # llama-server's extension
    ]
    for response_format in formats:
        reply = client(server).chat.completions.create(
            model=MODEL_ID, messages=ASK_PERSON, temperature=0, max_tokens=64, response_format=response_format
        )
        assert reply.choices[0].message.content == expected
    jsonschema.validate(json.loads(expected), PERSON)


def test_a_value_breaking_a_keyword_llguidance_leaves_to_the_check_is_a_400_naming_it(server: Server) -> None:
    """Three items of two values repeat one, which ``uniqueItems`` refuses: llguidance cannot
    hold it while generating, so the finished value is validated and refused, whole or streamed."""
    repeating = {"type": "array", "items": {"enum": ["red", "blue"]}, "minItems": 3, "maxItems": 3, "uniqueItems": True}
    response_format: Any = {"type": "json_schema", "json_schema": {"schema": repeating}}
    with pytest.raises(openai.BadRequestError) as raised:
        client(server).chat.completions.create(
            model=MODEL_ID, messages=QUESTION, temperature=0, max_tokens=32, response_format=response_format
        )
    error = raised.value.body
    assert isinstance(error, dict)
    assert error["param"] == "response_format"
    assert "'uniqueItems' at $" in error["message"]
    body = {"messages": QUESTION, "max_tokens": 32, "response_format": response_format, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert response.status_code == 200  # the stream began before the value was finished
    assert "[DONE]" not in events
    last = json.loads(events[-1])
    assert "'uniqueItems' at $" in last["error"]["message"]
    streamed = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[1:-1])
    assert len(json.loads(streamed)) == 3


def test_response_format_json_object_streams_a_json_object(server: Server) -> None:
    chunks = client(server).chat.completions.create(
        model=MODEL_ID,
        messages=ASK_PERSON,
        temperature=0,
        max_tokens=96,
        response_format={"type": "json_object"},
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert isinstance(json.loads(text), dict)


def test_parse_with_a_pydantic_model_through_the_official_client(server: Server) -> None:
    class Person(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        name: str = pydantic.Field(max_length=20)
        age: int

    reply = client(server).chat.completions.parse(
        model=MODEL_ID, messages=ASK_PERSON, temperature=0, max_tokens=64, response_format=Person
    )
    assert isinstance(reply.choices[0].message.parsed, Person)


def test_a_weather_tool_round_trip_through_the_official_client(server: Server) -> None:
    api = client(server)
    called = api.chat.completions.create(model=MODEL_ID, messages=ASK_WEATHER, tools=[WEATHER], temperature=0)
    assert called.choices[0].finish_reason == "tool_calls"
    message = called.choices[0].message
    assert message.content is None
    (call,) = message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_")
    result = {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"}
    answer = api.chat.completions.create(
        model=MODEL_ID,
        messages=[*ASK_WEATHER, message.model_dump(exclude_none=True), result],
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_tokens=48,
    )
    assert answer.choices[0].message.tool_calls is None
    assert "sunny" in (answer.choices[0].message.content or "").lower()


def test_required_tool_choice_always_yields_a_parseable_call(server: Server) -> None:
    api = client(server)
    questions = ["What is the weather in Paris?", "Tell me a joke.", "What time is it?", "Hi!"]
    for seed, question in enumerate(questions * 2):
        reply = api.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": question}],
            tools=[WEATHER, TIME],
            tool_choice="required",
            temperature=1.0,
            seed=seed,
            max_tokens=96,
        )
        # A small model may repeat its call until max_tokens: the calls it completed still count.
        assert reply.choices[0].finish_reason in {"tool_calls", "length"}, reply
        assert reply.choices[0].message.tool_calls, reply
        for call in reply.choices[0].message.tool_calls:
            arguments = json.loads(call.function.arguments)
            if call.function.name == "get_time":
                assert arguments == {}  # no parameters: an object closed to every key
            else:
                jsonschema.validate(arguments, WEATHER["function"]["parameters"])


def test_a_named_tool_choice_and_a_streamed_call(server: Server) -> None:
    api = client(server)
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    options: dict[str, Any] = {"model": MODEL_ID, "messages": ASK_WEATHER, "temperature": 0, "max_tokens": 96}
    whole = api.chat.completions.create(**options, tools=[WEATHER, TIME], tool_choice=named)
    calls = whole.choices[0].message.tool_calls or []
    assert calls
    assert {call.function.name for call in calls} == {"get_time"}
    chunks = list(api.chat.completions.create(**options, tools=[WEATHER], stream=True))
    assert chunks[0].choices[0].delta.model_dump(exclude_unset=True) == {"role": "assistant"}
    streamed = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(streamed) == 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    (delta,) = streamed[0]
    assert delta.index == 0
    assert delta.function is not None
    assert (delta.function.name, json.loads(delta.function.arguments or "")) == ("get_weather", {"city": "Paris"})


def raw_post(server: Server, path: str, body: bytes | str, **headers: str) -> httpx.Response:
    data = body.encode() if isinstance(body, str) else body
    return httpx.post(
        f"{server.url}{path}", content=data, headers={"Content-Type": "application/json", **headers}, timeout=60
    )


def chat_body(**fields: Any) -> str:
    return json.dumps({"model": MODEL_ID, "messages": QUESTION, "max_tokens": 4, **fields})


HOSTILE_BODIES: list[tuple[str, str | bytes, int, str | None]] = [
    ("not json", "{bad", 400, None),
    ("not an object", "[1, 2]", 400, None),
    ("empty", "", 400, None),
    ("invalid utf-8", b'{"model": "\xff\xfe"}', 400, None),
    ("wrong type", chat_body(temperature="hot"), 400, "temperature"),
    ("string for a number", chat_body(max_tokens="5"), 400, "max_tokens"),
    ("unknown field", chat_body(frobnicate=1), 400, "frobnicate"),
    ("tool without its function", chat_body(tools=[{"type": "function"}]), 400, "tools.0.function"),
    (
        "tool_choice of an unknown function",
        chat_body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
        400,
        "tool_choice",
    ),
    ("tools of one name", chat_body(tools=[WEATHER, WEATHER]), 400, "tools"),
    (
        "tools with a response_format",
        chat_body(tools=[WEATHER], response_format={"type": "json_object"}),
        400,
        "tools",
    ),
    (
        "tool parameters llguidance cannot compile",
        chat_body(tools=[{**WEATHER, "function": {"name": "f", "parameters": {"not": {}}}}]),
        400,
        "tools",
    ),
    ("huge max_tokens", chat_body(max_tokens=10**30), 400, "max_tokens"),
    ("huge seed", chat_body(seed=10**30), 400, "seed"),
    (
        "infinite temperature",
        chat_body().replace('"max_tokens": 4', '"max_tokens": 4, "temperature": 1e999'),
        400,
        "temperature",
    ),
    ("NaN", chat_body().replace('"max_tokens": 4', '"max_tokens": NaN'), 400, "max_tokens"),
    ("negative max_tokens", chat_body(max_tokens=-1), 400, "max_tokens"),
    ("too many choices", chat_body(n=1000), 400, "n"),
    ("bad role", chat_body(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages.0.role"),
    ("no messages", chat_body(messages=[]), 400, "messages"),
    (
        "image part",
        chat_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]),
        400,
        "messages.0.content",
    ),
    ("logit_bias not a token", chat_body(logit_bias={"abc": 1}), 400, "logit_bias"),
    ("logit_bias a non-ASCII digit", chat_body(logit_bias={"\u00b2": 1}), 400, "logit_bias"),
    ("repeat_last_n below -1", chat_body(repeat_last_n=-2), 400, "repeat_last_n"),
    ("seed -1 is random, as in llama.cpp", chat_body(seed=-1, temperature=1.0), 200, None),
    ("repeat_last_n -1 is the whole sequence", chat_body(repeat_last_n=-1, repeat_penalty=1.2), 200, None),
    ("logit_bias out of vocabulary", chat_body(logit_bias={"99999999": 1}), 400, "logit_bias"),
    ("grammar that does not parse", chat_body(grammar="root ::= ("), 400, "grammar"),
    (
        "schema llguidance cannot compile",
        chat_body(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 3}},
            }
        ),
        400,
        "response_format",
    ),
    (
        "json_schema without its schema",
        chat_body(response_format={"type": "json_schema"}),
        400,
        "response_format.json_schema",
    ),
    ("unknown response_format", chat_body(response_format={"type": "xml"}), 400, "response_format.type"),
    (
        "lark that does not compile",
        chat_body(grammar="%llguidance {}\nstart: nowhere"),
        400,
        "grammar",
    ),
    (
        "grammar and response_format",
        chat_body(grammar='root ::= "a"', response_format={"type": "json_object"}),
        400,
        "response_format",
    ),
    ("top_logprobs without logprobs", chat_body(top_logprobs=2), 400, "top_logprobs"),
    ("top_logprobs too many", chat_body(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("any model name is the served model", chat_body(model="gpt-4o"), 200, None),
    ("no model is the served model", json.dumps({"messages": QUESTION, "max_tokens": 4}), 200, None),
    ("a message that is not an object", chat_body(messages=[123]), 400, "messages.0"),
    ("a tool that is not an object", chat_body(tools=["get_weather"]), 400, "tools.0"),
    (
        "json_schema without a name",
        chat_body(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}),
        200,
        None,
    ),
    (
        "a schema with a type other than json_object",
        chat_body(response_format={"type": "text", "schema": {"type": "integer"}}),
        400,
        "response_format.schema",
    ),
    ("nested depth", '{"model": ' + "[" * 100_000 + "]" * 100_000 + "}", 400, None),
    ("NUL in content", chat_body(messages=[{"role": "user", "content": "a\u0000b"}]), 400, "messages"),
]


@pytest.mark.parametrize(
    ("body", "status", "param"), [case[1:] for case in HOSTILE_BODIES], ids=[case[0] for case in HOSTILE_BODIES]
)
def test_hostile_chat_bodies_get_4xx_in_openais_shape(
    server: Server, body: str | bytes, status: int, param: str | None
) -> None:
    response = raw_post(server, "/v1/chat/completions", body)
    assert response.status_code == status, response.text
    if status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["message"]
        assert error["param"] == param


def test_hostile_completion_bodies_get_400(server: Server) -> None:
    base = {"model": MODEL_ID, "max_tokens": 2}
    for fields in (
        {"prompt": []},
        {"prompt": [[]]},
        {"prompt": [-1]},
        {"prompt": [2**40]},
        {"prompt": "hi", "echo": True},
        {"prompt": "hi", "suffix": "x"},
        {"prompt": "hi", "best_of": 3},
        {"prompt": "hi", "logprobs": 50},
        {"prompt": "hi", "stop": ["a"] * 100},
        {"prompt": {"text": "hi"}},
    ):
        response = raw_post(server, "/v1/completions", json.dumps({**base, **fields}))
        assert response.status_code == 400, (fields, response.text)
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_prompt_longer_than_a_sequence_is_400_with_its_numbers(server: Server, engine: llamactx.Engine) -> None:
    prompt = "word " * 600  # a sequence holds 4096 / 8 = 512 tokens
    with pytest.raises(openai.BadRequestError) as refused:
        client(server).completions.create(model=MODEL_ID, prompt=prompt, max_tokens=1)
    assert refused.value.code == "context_length_exceeded"
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["n_prompt_tokens"] == len(engine.tokens(prompt))
    assert refused.value.body["n_ctx"] == 512
    # An empty prompt (SmolLM2 adds no BOS) fails the engine's same check: a 400 naming it.
    with pytest.raises(openai.BadRequestError, match="the prompt has no tokens") as empty:
        client(server).completions.create(model=MODEL_ID, prompt="", max_tokens=1)
    assert isinstance(empty.value.body, dict)
    assert empty.value.body["param"] == "prompt"


def test_oversized_bodies_are_413_and_the_server_lives_on(server: Server) -> None:
    huge = json.dumps({"model": MODEL_ID, "prompt": "x" * (10 * 2**20), "max_tokens": 1})
    response = raw_post(server, "/v1/completions", huge)
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        yield b'{"model": "x", "prompt": "'
        for _ in range(10):
            yield b"y" * 2**20
        yield b'"}'

    streamed = httpx.post(f"{server.url}/v1/completions", content=chunks(), timeout=60)
    assert streamed.status_code == 413
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}


def test_a_content_length_that_is_not_a_number_is_4xx(server: Server) -> None:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    for length in ("\u00b2", "-1", "1e3"):
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(
                f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n{{}}".encode("latin-1")
            )
            status = raw.recv(4096).split(b" ", 2)[1]
        assert status.startswith(b"4"), (length, status)


def test_unknown_routes_and_methods_are_4xx_in_openais_shape(server: Server) -> None:
    missing = httpx.get(f"{server.url}/v1/nothing-here")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong_method = httpx.get(f"{server.url}/v1/chat/completions")
    assert wrong_method.status_code == 405
    assert "error" in wrong_method.json()


def never_ending(model: llamactx.LlamaModel) -> dict[str, int]:
    """``logit_bias`` banning the end-of-generation tokens: the request runs to ``max_tokens``."""
    return {str(token): -100 for token in range(model.n_vocab()) if model.is_eog_token(token)}


def test_a_full_queue_is_503_with_retry_after(model_path: Path, model: llamactx.LlamaModel) -> None:
    with running_server(model_path, "--parallel", "1", "--ctx", "1024", "--max-waiting", "1") as busy:
        api = client(busy, max_retries=0)
        options: dict[str, Any] = {
            "model": MODEL_ID,
            "prompt": PROMPTS[1],
            "max_tokens": 500,
            "stream": True,
            "logit_bias": never_ending(model),
        }
        running = api.completions.create(**options)
        next(iter(running))  # decoding: it holds the one slot
        waiting = api.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=500, stream=True)
        next(iter(waiting))  # the role chunk: it was queued
        with pytest.raises(openai.APIStatusError) as refused:
            api.completions.create(model=MODEL_ID, prompt="hi", max_tokens=1)
        assert refused.value.status_code == 503
        assert refused.value.response.headers["Retry-After"] == "1"
        assert refused.value.code == "server_busy"
        running.close()
        waiting.close()
        busy.wait_until_idle()


def test_a_client_that_leaves_cancels_its_request(server: Server, model: llamactx.LlamaModel) -> None:
    api = client(server)
    before = server.metrics()["llamactx_engine_tokens_generated_total"]
    stream = api.completions.create(
        model=MODEL_ID,
        prompt=PROMPTS[2],
        max_tokens=400,
        temperature=0,
        stream=True,
        logit_bias=never_ending(model),
    )
    for _, _chunk in zip(range(3), stream, strict=False):
        pass
    stream.close()
    server.wait_until_idle()
    assert server.metrics()["llamactx_engine_tokens_generated_total"] - before < 400

    before = server.metrics()["llamactx_engine_tokens_generated_total"]
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as raw:
        body = json.dumps(
            {
                "model": MODEL_ID,
                "prompt": PROMPTS[2],
                "max_tokens": 400,
                "temperature": 0,
                "logit_bias": never_ending(model),
            }
        )
        raw.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        time.sleep(0.5)
    server.wait_until_idle()
    assert server.metrics()["llamactx_engine_tokens_generated_total"] - before < 400


def test_metrics_count_requests_tokens_and_latencies(server: Server) -> None:
    before = server.metrics()
    reply = client(server).completions.create(model=MODEL_ID, prompt=PROMPTS[0], temperature=0, max_tokens=5)
    after = server.metrics()
    route = 'llamactx_requests_total{route="/v1/completions",status="200"}'
    assert after[route] == before.get(route, 0) + 1
    assert reply.usage is not None
    assert after["llamactx_completion_tokens_total"] - before["llamactx_completion_tokens_total"] == 5
    assert after["llamactx_prompt_tokens_total"] - before["llamactx_prompt_tokens_total"] == reply.usage.prompt_tokens
    assert (
        after["llamactx_time_to_first_token_seconds_count"] == before["llamactx_time_to_first_token_seconds_count"] + 1
    )
    assert after["llamactx_engine_kv_cells_total"] == 4096
    assert after["llamactx_engine_n_seq_max"] == 8


def test_each_request_is_logged(server: Server) -> None:
    reply = client(server).completions.create(model=MODEL_ID, prompt=PROMPTS[0], temperature=0, max_tokens=3)
    deadline = time.monotonic() + 10
    while not any(reply.id in line for line in server.log):
        assert time.monotonic() < deadline, "".join(server.log)
        time.sleep(0.05)
    line = next(line for line in server.log if reply.id in line)
    assert "completion 3 tokens" in line


def test_create_app_mounts_in_another_asgi_app(engine: llamactx.Engine, caplog: pytest.LogCaptureFixture) -> None:
    app = Starlette(routes=[Mount("/llm", app=create_app(engine, model_id="local", api_key=API_KEY))])
    expected = engine.submit(PROMPTS[0], max_tokens=4).result(60).text

    async def call() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            health = await http.get("/llm/health")
            reply = await http.post(
                "/llm/v1/completions",
                json={"model": "local", "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0},
                headers={"Authorization": f"Bearer {API_KEY}"},
            )
            return health, reply

    with caplog.at_level(logging.INFO, logger="llamactx.server"):
        health, reply = asyncio.run(call())
    assert health.json() == {"status": "ok"}
    assert reply.json()["choices"][0]["text"] == expected
    [record] = [record for record in caplog.records if record.name == "llamactx.server"]
    assert record.request_id == reply.json()["id"]  # type: ignore[attr-defined]
    assert record.completion_tokens == 4  # type: ignore[attr-defined]


def test_a_closed_engine_is_503_and_unhealthy(model: llamactx.LlamaModel) -> None:
    engine = llamactx.Engine(model, n_ctx=512, n_seq_max=1)
    app = create_app(engine, model_id="local")
    engine.close()

    async def call() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            health = await http.get("/health")
            reply = await http.post("/v1/completions", json={"model": "local", "prompt": "Hi", "max_tokens": 2})
            return health, reply

    health, reply = asyncio.run(call())
    assert health.status_code == 503
    assert reply.status_code == 503
    assert reply.headers["Retry-After"] == "1"
    assert reply.json()["error"]["message"] == "the server is shutting down"


def test_flash_attention_off_serves_what_an_engine_without_it_computes(
    model_path: Path, model: llamactx.LlamaModel
) -> None:
    prompt = "The capital of France is"
    options = ("--no-prefix-cache", "--parallel", "1", "--ctx", "1024", "--flash-attn", "off")
    with running_server(model_path, *options) as without_flash_attention:
        reply = client(without_flash_attention).completions.create(
            model=MODEL_ID, prompt=prompt, max_tokens=8, temperature=0, logprobs=1
        )
    assert reply.choices[0].logprobs is not None
    served = reply.choices[0].logprobs.token_logprobs
    assert served is not None
    engines: dict[int, list[float]] = {}
    for flash_attn_type in (0, -1):
        with llamactx.Engine(model, n_ctx=1024, n_seq_max=1, prefix_cache=False, flash_attn_type=flash_attn_type) as e:
            completion = e.submit(prompt, max_tokens=8, logprobs=1).result(60)
        engines[flash_attn_type] = [entry[0][1] for entry in completion.logprobs]
    assert served == pytest.approx(engines[0], abs=1e-5)
    # Flash attention's numbers differ (by up to 0.1 here), so the option took effect.
    assert max(abs(a - b) for a, b in zip(served, engines[-1], strict=True)) > 1e-3


def test_a_chat_template_given_at_start_renders_every_chat(model_path: Path, model: llamactx.LlamaModel) -> None:
    messages: list[Any] = [{"role": "user", "content": "Name a colour."}]
    with llamactx.Engine(model, chat_template=PLAIN_CHATML, **ENGINE_OPTIONS) as engine:
        expected = engine.submit_chat(messages, max_tokens=12).result().text
    with (
        running_server(model_path, "--chat-template", PLAIN_CHATML) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused") as client,
    ):
        reply = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == expected
    # A template that cannot render stops the server at its start, not each request.
    with (
        pytest.raises(AssertionError, match="llamactx serve: the chat template"),
        running_server(model_path, "--chat-template", "{% for %}"),
    ):
        pass


def test_a_requests_chat_template_kwargs_reach_the_template(model_path: Path, model: llamactx.LlamaModel) -> None:
    """A request's variables go over the server's (``--chat-template-kwargs``), one by one."""
    messages: list[Any] = [{"role": "user", "content": "Name a colour."}]
    kwargs = {"enable_thinking": True, "greeting": "Be brief."}
    with llamactx.Engine(model, chat_template=CHATML_WITH_VARIABLES, **ENGINE_OPTIONS) as engine:
        expected = engine.submit_chat(messages, max_tokens=12, chat_template_kwargs=kwargs).result()
        greeted = engine.submit_chat(messages, max_tokens=12, chat_template_kwargs={"greeting": "Hi."}).result()
    server_kwargs = json.dumps({"greeting": "Hi."})
    with (
        running_server(
            model_path, "--chat-template", CHATML_WITH_VARIABLES, "--chat-template-kwargs", server_kwargs
        ) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client,
    ):
        reply = client.chat.completions.create(
            model=MODEL_ID,
            messages=messages,
            max_tokens=12,
            temperature=0,
            extra_body={"chat_template_kwargs": kwargs},
        )
        assert reply.choices[0].message.content == expected.text
        assert reply.usage is not None
        assert reply.usage.prompt_tokens == expected.prompt_tokens
        plain = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12, temperature=0)
        assert plain.choices[0].message.content == greeted.text
        assert plain.usage is not None
        assert plain.usage.prompt_tokens == greeted.prompt_tokens
        for bad in ({"enable_thinking": "no"}, ["enable_thinking"]):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(
                    model=MODEL_ID, messages=messages, max_tokens=2, extra_body={"chat_template_kwargs": bad}
                )
            assert refused.value.body["param"] == "chat_template_kwargs"  # type: ignore[index]


def test_a_lora_adapter_given_at_start_applies_to_every_request_at_the_scale_asked(
    model_path: Path, model: llamactx.LlamaModel, lora_path: Path
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Name a colour."}]
    adapter = model.lora_adapter_init(lora_path)
    with llamactx.Engine(model, lora_adapter=adapter, lora_scale=0.5, **ENGINE_OPTIONS) as engine:
        expected = engine.submit_chat(messages, max_tokens=12).result().text
    with llamactx.Engine(model, **ENGINE_OPTIONS) as engine:
        plain = engine.submit_chat(messages, max_tokens=12).result().text
    assert expected != plain
    with (
        running_server(model_path, "--no-prefix-cache", "--lora-scaled", f"{lora_path}:0.5") as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused") as client,
    ):

        def reply(**extra: Any) -> str | None:
            answer = client.chat.completions.create(
                model=MODEL_ID, messages=messages, max_tokens=12, temperature=0, extra_body=extra
            )
            return answer.choices[0].message.content

        at_start = reply()
        without = reply(lora=[])  # llama-server's: an adapter left out of a request's list is at 0
        listed = httpx.get(f"{server.url}/lora-adapters").json()
        changed = httpx.post(f"{server.url}/lora-adapters", json=[{"id": 0, "scale": 0.0}])
        after_change = reply()
        relisted = httpx.get(f"{server.url}/lora-adapters").json()
        per_request = reply(lora=[{"id": 0, "scale": 0.5}])
        unknown = httpx.post(f"{server.url}/lora-adapters", json=[{"id": 3, "scale": 1.0}])
        with pytest.raises(openai.BadRequestError, match="id 3"):
            reply(lora=[{"id": 3, "scale": 1.0}])
    assert (at_start, without) == (expected, plain)
    assert listed == [{"id": 0, "path": str(lora_path), "scale": 0.5}]  # llama-server's shape
    assert changed.json() == {"success": True}
    assert after_change == plain
    assert relisted[0]["scale"] == 0.0
    assert per_request == expected
    assert unknown.status_code == 400


def test_kv_cache_types_and_batch_sizes_are_the_engines_context_options(
    model_path: Path, model: llamactx.LlamaModel
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Name a colour."}]
    context = {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "n_batch": 256, "n_ubatch": 128, "flash_attn_type": 1}
    context["n_threads_batch"] = 1
    with llamactx.Engine(model, **context, **ENGINE_OPTIONS) as engine:
        expected = engine.submit_chat(messages, max_tokens=12).result().text
    flags = ("-ctk", "q8_0", "--cache-type-v", "q8_0", "-b", "256", "--ubatch-size", "128", "-tb", "1")
    flags += ("--flash-attn", "on")
    with (
        running_server(model_path, "--no-prefix-cache", *flags) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused") as client,
    ):
        reply = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == expected
    # llama.cpp refuses a quantized V cache without flash attention only by logging it.
    with (
        pytest.raises(AssertionError, match=r"a quantized V cache .* needs flash attention"),
        running_server(model_path, "--cache-type-v", "q8_0", "--flash-attn", "off"),
    ):
        pass
