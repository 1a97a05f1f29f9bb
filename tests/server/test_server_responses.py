"""OpenAI's Responses API on ``llamactx serve``, driven by the official ``openai`` client (sync
and async, streamed and not), with outputs checked against the in-process ``Engine`` on the same
options and the same rendered chat."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest
import uvicorn
from support.prompts import HELPFUL
from support.serving import ENGINE_OPTIONS, MODEL_ID, Server, running_server
from support.tool_examples import ASK_WEATHER, WEATHER

import llamactx
from llamactx.server import create_app
from llamactx.server._responses import ResponseStore, StoredResponse
from llamactx.server._responses_protocol import MessageItem

QUESTION = "What is the capital of France?"
MESSAGES = [{"role": "system", "content": HELPFUL}, {"role": "user", "content": QUESTION}]
#: ``WEATHER`` as the Responses API takes a function tool: flat, not under ``function``.
WEATHER_TOOL: Any = {"type": "function", **WEATHER["function"], "strict": True}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
CALL_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
]


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[Server]:
    """Without the prefix cache, so outputs equal the engine's token for token."""
    with running_server(model_path, "--no-prefix-cache") as running:
        yield running


@pytest.fixture(scope="module")
def engine(model: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(model, **ENGINE_OPTIONS) as reference:
        yield reference


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def events_of(server: Server, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A streamed response's events as sent: each ``(event name, data)``."""
    response = httpx.post(f"{server.url}/v1/responses", json={**body, "stream": True}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in response.text.strip().split("\n\n"):
        name, data = block.split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def collapsed(kinds: list[str]) -> list[str]:
    """``kinds`` with each run of one kind as one."""
    return [kind for index, kind in enumerate(kinds) if index == 0 or kinds[index - 1] != kind]


def test_a_greedy_response_equals_the_engines_chat_and_counts_usage(
    api: openai.OpenAI, engine: llamactx.Engine
) -> None:
    response = api.responses.create(
        model=MODEL_ID, instructions=HELPFUL, input=QUESTION, temperature=0, max_output_tokens=32
    )
    expected = engine.submit_chat(MESSAGES, max_tokens=32).result(60)
    assert "Paris" in expected.text
    assert response.output_text == expected.text
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert (response.status, response.incomplete_details) == ("completed", None)
    assert response.model == MODEL_ID
    (message,) = response.output
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.id.startswith("msg_")
    assert response.usage is not None
    assert response.usage.input_tokens == len(engine.chat_tokens(MESSAGES)) == expected.prompt_tokens
    assert response.usage.output_tokens == expected.completion_tokens
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    assert (response.instructions, response.temperature, response.max_output_tokens) == (HELPFUL, 0, 32)


def test_input_as_text_and_as_items_render_the_same(api: openai.OpenAI) -> None:
    options: dict[str, Any] = {"model": MODEL_ID, "temperature": 0, "max_output_tokens": 8}
    inputs: list[Any] = [
        [{"role": "user", "content": QUESTION}],
        [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is the "},
                    {"type": "input_text", "text": "capital of France?"},
                ],
            }
        ],
    ]
    expected = api.responses.create(**options, instructions=HELPFUL, input=QUESTION)
    assert expected.usage is not None
    for given in [*inputs, [{"role": "developer", "content": HELPFUL}, *inputs[0]]]:
        response = api.responses.create(
            **options, instructions=None if given[0]["role"] == "developer" else HELPFUL, input=given
        )
        assert response.output_text == expected.output_text
        assert response.usage is not None
        assert response.usage.input_tokens == expected.usage.input_tokens


def test_a_streamed_response_is_the_whole_one_event_by_event(server: Server, api: openai.OpenAI) -> None:
    body: dict[str, Any] = {"instructions": HELPFUL, "input": QUESTION, "temperature": 0, "max_output_tokens": 32}
    whole = api.responses.create(model=MODEL_ID, **body)
    events = events_of(server, body)
    assert all(data["type"] == name for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert collapsed([name for name, _ in events]) == [*TEXT_EVENTS, "response.completed"]
    deltas = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    assert deltas == whole.output_text
    (done,) = [data for name, data in events if name == "response.output_text.done"]
    assert done["text"] == whole.output_text
    final = events[-1][1]["response"]
    assert final["status"] == "completed"
    assert whole.usage is not None
    assert final["usage"]["output_tokens"] == whole.usage.output_tokens
    assert events[0][1]["response"]["id"] == final["id"] != whole.id
    assert events[0][1]["response"]["status"] == "in_progress"

    with api.responses.stream(model=MODEL_ID, **body) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert collapsed(kinds) == [*TEXT_EVENTS, "response.completed"]
    assert streamed.output_text == whole.output_text


def test_async_clients_get_what_the_sync_client_gets(server: Server, api: openai.OpenAI) -> None:
    options: dict[str, Any] = {"model": MODEL_ID, "instructions": HELPFUL, "temperature": 0, "max_output_tokens": 16}
    questions = [QUESTION, "What is the capital of Italy?"]
    expected = [api.responses.create(**options, input=question).output_text for question in questions]

    async def ask_all() -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
            answers = await asyncio.gather(*(client.responses.create(**options, input=q) for q in questions))
            return [answer.output_text for answer in answers]

    assert asyncio.run(ask_all()) == expected


def test_max_output_tokens_makes_the_response_incomplete(server: Server, api: openai.OpenAI) -> None:
    body: dict[str, Any] = {"instructions": HELPFUL, "input": QUESTION, "temperature": 0, "max_output_tokens": 3}
    response = api.responses.create(model=MODEL_ID, **body)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None
    assert response.usage.output_tokens == 3
    assert response.output[0].type == "message"
    assert response.output[0].status == "incomplete"
    events = events_of(server, body)
    assert collapsed([name for name, _ in events]) == [*TEXT_EVENTS, "response.incomplete"]
    assert events[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_text_format_json_schema_returns_the_engines_valid_json(api: openai.OpenAI, engine: llamactx.Engine) -> None:
    ask = [{"role": "system", "content": HELPFUL}, {"role": "user", "content": "Describe a person as JSON."}]
    expected = engine.submit_chat(ask, max_tokens=64, json_schema=PERSON).result(60)
    text: Any = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    response = api.responses.create(
        model=MODEL_ID,
        input=ask,
        temperature=0,
        max_output_tokens=64,
        text=text,  # type: ignore[arg-type]
    )
    assert response.output_text == expected.text
    jsonschema.validate(json.loads(response.output_text), PERSON)
    assert response.text is not None
    assert response.text.model_dump(by_alias=True, exclude_none=True) == text


def test_parse_with_a_pydantic_model_through_the_official_client(api: openai.OpenAI) -> None:
    class Person(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        name: str = pydantic.Field(max_length=20)
        age: int

    response = api.responses.parse(
        model=MODEL_ID,
        instructions=HELPFUL,
        input="Describe a person as JSON.",
        temperature=0,
        max_output_tokens=64,
        text_format=Person,
    )
    assert isinstance(response.output_parsed, Person)


def test_a_function_call_is_an_item_streamed_or_not(api: openai.OpenAI) -> None:
    options: dict[str, Any] = {"model": MODEL_ID, "input": ASK_WEATHER, "tools": [WEATHER_TOOL], "temperature": 0}
    response = api.responses.create(**options)
    (call,) = response.output
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert call.call_id.startswith("call_")
    assert call.id is not None
    assert call.id.startswith("fc_")
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER_TOOL["parameters"])
    assert arguments == {"city": "Paris"}
    assert response.output_text == ""
    assert response.tools[0].type == "function"

    with api.responses.stream(**options) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert kinds == CALL_EVENTS
    (streamed_call,) = streamed.output
    assert streamed_call.type == "function_call"
    assert (streamed_call.name, json.loads(streamed_call.arguments)) == ("get_weather", {"city": "Paris"})


def test_a_follow_up_continues_the_stored_conversation(api: openai.OpenAI, engine: llamactx.Engine) -> None:
    first = api.responses.create(model=MODEL_ID, input=ASK_WEATHER, tools=[WEATHER_TOOL], temperature=0)
    (call,) = first.output
    assert call.type == "function_call"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}
    options: dict[str, Any] = {
        "model": MODEL_ID,
        "tools": [WEATHER_TOOL],
        "tool_choice": "none",
        "temperature": 0,
        "max_output_tokens": 12,
    }
    continued = api.responses.create(**options, previous_response_id=first.id, input=[result])
    whole = api.responses.create(**options, input=[*ASK_WEATHER, *first.output, result])
    assert continued.previous_response_id == first.id
    assert continued.output_text == whole.output_text
    assert "sunny" in continued.output_text.lower()
    # The same chat the chat endpoint renders for the same conversation.
    conversation = [
        *ASK_WEATHER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 24 C"},
    ]
    tokens = engine.prepare_chat(conversation, tools=[WEATHER], tool_choice="none").tokens
    assert continued.usage is not None
    assert whole.usage is not None
    assert continued.usage.input_tokens == whole.usage.input_tokens == len(tokens)
    # A follow-up of the follow-up carries the whole conversation on.
    again = api.responses.create(**options, previous_response_id=continued.id, input="Thanks!")
    both = api.responses.create(
        **options,
        input=[*ASK_WEATHER, *first.output, result, *continued.output, {"role": "user", "content": "Thanks!"}],
    )
    assert again.usage is not None
    assert both.usage is not None
    assert (again.output_text, again.usage.input_tokens) == (both.output_text, both.usage.input_tokens)


def test_an_unknown_or_unstored_previous_response_is_a_400_naming_it(api: openai.OpenAI) -> None:
    unstored = api.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=1, store=False)
    assert unstored.to_dict()["store"] is False
    for response_id in ("resp_unknown", unstored.id):
        with pytest.raises(openai.BadRequestError) as refused:
            api.responses.create(model=MODEL_ID, input="Hi", previous_response_id=response_id, max_output_tokens=1)
        assert refused.value.code == "previous_response_not_found"
        assert refused.value.param == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(unstored.id)


def test_a_stored_response_is_retrieved_and_deleted(server: Server, api: openai.OpenAI) -> None:
    created = api.responses.create(
        model=MODEL_ID, instructions=HELPFUL, input=QUESTION, temperature=0, max_output_tokens=8, metadata={"k": "v"}
    )
    retrieved = api.responses.retrieve(created.id)
    assert retrieved.model_dump() == created.model_dump()
    assert retrieved.metadata == {"k": "v"}
    without_v1 = httpx.get(f"{server.url}/responses/{created.id}", timeout=10)
    assert without_v1.json()["output"][0]["content"][0]["text"] == created.output_text
    api.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.delete(created.id)
    with pytest.raises(openai.BadRequestError):
        api.responses.create(model=MODEL_ID, input="Hi", previous_response_id=created.id, max_output_tokens=1)


def test_a_failure_while_streaming_is_an_error_event_then_the_response_failed(model: llamactx.LlamaModel) -> None:
    engine = llamactx.Engine(model, n_ctx=1024, n_seq_max=1, prefix_cache=False)
    listening = socket.create_server(("127.0.0.1", 0))  # connections wait in its backlog until uvicorn runs
    host, port = listening.getsockname()
    served = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning"))
    thread = threading.Thread(target=served.run, kwargs={"sockets": [listening]})
    thread.start()
    body = {"input": "Write a long story about a dragon.", "temperature": 0, "max_output_tokens": 300, "stream": True}
    names: list[str] = []
    data: dict[str, Any] = {}
    try:
        with httpx.stream("POST", f"http://{host}:{port}/v1/responses", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("event: "):
                    names.append(line.removeprefix("event: "))
                    if names[-1] == "response.output_text.delta" and not engine.closed:
                        engine.close()  # the engine cancels the request: the response cannot finish
                elif line.startswith("data: "):
                    data = json.loads(line.removeprefix("data: "))
    finally:
        served.should_exit = True
        thread.join()
        engine.close()
    assert collapsed(names) == [*TEXT_EVENTS[:5], "error", "response.failed"]
    assert data["response"]["status"] == "failed"
    assert data["response"]["error"] == {"code": "server_error", "message": "the server is shutting down"}


def stored(response_id: str, text: str) -> StoredResponse:
    response: Any = {"id": response_id, "output": text}
    return StoredResponse(response, (MessageItem(role="user", content=text),))


def test_the_store_evicts_the_oldest_past_its_bounds() -> None:
    by_count = ResponseStore(max_responses=2)
    for name in ("a", "b", "c"):
        by_count.put(stored(name, "hello"))
    assert len(by_count) == 2
    assert by_count.get("a") is None
    assert [by_count.get(name) is not None for name in ("b", "c")] == [True, True]
    assert by_count.delete("b")
    assert not by_count.delete("b")
    by_count.put(stored("d", "hello"))
    assert [by_count.get(name) is not None for name in ("c", "d")] == [True, True]

    size = stored("x", "hello").size()
    by_bytes = ResponseStore(max_bytes=2 * size + size // 2)
    for name in ("a", "b", "c"):
        by_bytes.put(stored(name, "hello"))
    assert [by_bytes.get(name) is not None for name in ("a", "b", "c")] == [False, True, True]
    by_bytes.put(stored("big", "hello" * 100))  # over the budget alone: evicts everything, itself too
    assert len(by_bytes) == 0
    by_bytes.put(stored("e", "hello"))
    assert by_bytes.get("e") is not None


def responses_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "input": QUESTION, "max_output_tokens": 2, **fields}


HOSTILE_BODIES: list[tuple[str, Any, str | None]] = [
    ("unknown field", responses_body(frobnicate=1), "frobnicate"),
    ("no input", {"model": MODEL_ID}, "input"),
    ("input not text or items", responses_body(input=5), "input"),
    ("no items", responses_body(input=[]), "input"),
    ("an item that is not an object", responses_body(input=[123]), "input.0"),
    ("an item of an unknown type", responses_body(input=[{"type": "web_search_call", "id": "x"}]), "input.0"),
    ("a bad role", responses_body(input=[{"role": "wizard", "content": "hi"}]), "input.0.role"),
    (
        "an image, on a server without a projector",
        responses_body(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]),
        "input",
    ),
    (
        "an image by file id",
        responses_body(input=[{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]),
        "input.0.content.0.image_url",
    ),
    (
        "a file",
        responses_body(
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}, {"type": "input_file", "file_id": "f"}],
                }
            ]
        ),
        "input.0.content.1",
    ),
    (
        "a call without its id",
        responses_body(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
        "input.0.call_id",
    ),
    ("NUL in the input", responses_body(input="a\u0000b"), "input"),
    ("a web search tool", responses_body(tools=[{"type": "web_search"}]), "tools.0"),
    ("a tool without its name", responses_body(tools=[{"type": "function", "parameters": {}}]), "tools.0.name"),
    ("tools of one name", responses_body(tools=[WEATHER_TOOL, WEATHER_TOOL]), "tools"),
    (
        "tool parameters llguidance cannot compile",
        responses_body(tools=[{**WEATHER_TOOL, "parameters": {"$ref": "#/nope"}}]),
        "tools",
    ),
    ("a tool_choice of another tool type", responses_body(tool_choice={"type": "web_search_preview"}), "tool_choice"),
    (
        "a tool_choice of an unknown function",
        responses_body(tools=[WEATHER_TOOL], tool_choice={"type": "function", "name": "nope"}),
        "tool_choice",
    ),
    ("a text format of another type", responses_body(text={"format": {"type": "xml"}}), "text.format.type"),
    (
        "json_schema without its schema",
        responses_body(text={"format": {"type": "json_schema", "name": "x"}}),
        "text.format.schema",
    ),
    (
        "a schema llguidance cannot compile",
        responses_body(text={"format": {"type": "json_schema", "name": "x", "schema": {"$ref": "#/nope"}}}),
        "text.format",
    ),
    (
        "a text format with tools",
        responses_body(tools=[WEATHER_TOOL], text={"format": {"type": "json_object"}}),
        "tools",
    ),
    ("negative max_output_tokens", responses_body(max_output_tokens=-1), "max_output_tokens"),
    ("temperature out of range", responses_body(temperature=3), "temperature"),
    ("truncation auto", responses_body(truncation="auto"), "truncation"),
    ("metadata not strings", responses_body(metadata={"k": 1}), "metadata.k"),
    ("stream_options", responses_body(stream_options={"include_obfuscation": False}), "stream_options"),
]


@pytest.mark.parametrize(
    ("body", "param"), [case[1:] for case in HOSTILE_BODIES], ids=[case[0] for case in HOSTILE_BODIES]
)
def test_malformed_bodies_are_400_naming_the_field(server: Server, body: Any, param: str | None) -> None:
    response = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    assert error["param"] == param


def test_what_is_accepted_and_echoed(api: openai.OpenAI) -> None:
    response = api.responses.create(
        model="gpt-4.1",  # any name is the served model
        input=QUESTION,
        max_output_tokens=1,
        truncation="disabled",
        reasoning={"effort": "low"},
        user="someone",
        parallel_tool_calls=False,
        tool_choice="none",
    )
    assert response.model == MODEL_ID
    assert (response.truncation, response.user, response.parallel_tool_calls, response.tool_choice) == (
        "disabled",
        "someone",
        False,
        "none",
    )
    assert response.reasoning is not None
    assert response.reasoning.effort == "low"  # the template's reasoning_effort (test_server_reasoning.py)
    assert response.text is not None
    assert response.text.format.type == "text"
    assert api.responses.retrieve(response.id).to_dict()["store"] is True
