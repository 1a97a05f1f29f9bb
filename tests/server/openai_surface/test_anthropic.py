"""llama.cpp's ``unit/test_compat_anthropic.py``: Anthropic's Messages API (``/v1/messages``,
``/v1/messages/count_tokens``), raw, as its tests send it. Left out: the tests that need a vision
or a reasoning model, and its acceptance of an empty ``messages`` (llama-server's own leniency:
Anthropic refuses it). Replies are short, but for a tool call's, which must end with the call."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import llamactx

from .streams import events
from .tokens import chat_tokens

HEADERS = {"anthropic-version": "2023-06-01"}
#: Messages are greedy unless a test says otherwise (llama.cpp's sample), so that a reply is the
#: same on every run: an empty one, or one whose first token is half a character, would otherwise
#: come by chance.
GREEDY = {"temperature": 0}
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a location",
    "input_schema": {
        "type": "object",
        "properties": {"location": {"type": "string", "description": "City name"}},
        "required": ["location"],
    },
}
RED_PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


def post(http: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    return http.post(path, json={"model": "test", **body}, headers=HEADERS)


def message(http: httpx.Client, **body: Any) -> dict[str, Any]:
    """``POST /v1/messages``: the message, checked to be one."""
    response = post(http, "/v1/messages", {**GREEDY, **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer["type"] == "message"
    return answer


def stream(http: httpx.Client, **body: Any) -> list[dict[str, Any]]:
    with http.stream(
        "POST", "/v1/messages", json={"model": "test", **GREEDY, **body, "stream": True}, headers=HEADERS
    ) as response:
        return list(events(response))


def tool_exchange(result: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A weather question, the assistant's call, and ``result`` as the user's next turn."""
    call = {"type": "tool_use", "id": "test123", "name": "get_weather", "input": {"location": "Paris"}}
    return [
        {"role": "user", "content": "What's the weather?"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": result},
    ]


def test_anthropic_messages_basic(http: httpx.Client) -> None:
    answer = message(http, max_tokens=16, messages=[{"role": "user", "content": "Say hello"}])
    assert answer["role"] == "assistant"
    assert answer["content"]
    assert answer["content"][0]["type"] == "text"
    assert "text" in answer["content"][0]
    assert answer["stop_reason"] in ("end_turn", "max_tokens")
    usage = answer["usage"]
    assert isinstance(usage["input_tokens"], int)
    assert isinstance(usage["output_tokens"], int)
    assert usage["output_tokens"] > 0
    assert "timings" not in answer


def test_anthropic_messages_with_system(http: httpx.Client) -> None:
    answer = message(
        http, max_tokens=16, system="You are a helpful assistant.", messages=[{"role": "user", "content": "Hello"}]
    )
    assert answer["content"]


def test_anthropic_messages_multipart_content(http: httpx.Client) -> None:
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": " the answer?"}]
    assert message(http, max_tokens=16, messages=[{"role": "user", "content": parts}])["content"]


def test_anthropic_messages_conversation(http: httpx.Client) -> None:
    turns = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
        {"role": "user", "content": "How are you?"},
    ]
    assert message(http, max_tokens=16, messages=turns)["content"]


def test_anthropic_messages_streaming(http: httpx.Client) -> None:
    received = stream(http, max_tokens=16, messages=[{"role": "user", "content": "Say hello"}])
    kinds = [event["type"] for event in received]
    # Anthropic's order; llama.cpp's test checks that each kind is there.
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    start = received[0]["message"]
    assert (start["type"], start["role"], start["content"]) == ("message", "assistant", [])
    assert start["usage"]["input_tokens"] > 0
    block = next(event for event in received if event["type"] == "content_block_start")
    assert (block["index"], block["content_block"]["type"]) == (0, "text")
    deltas = [event for event in received if event["type"] == "content_block_delta"]
    assert all(event["delta"]["type"] == "text_delta" and "text" in event["delta"] for event in deltas)
    assert next(event for event in received if event["type"] == "content_block_stop")["index"] == 0
    ending = next(event for event in received if event["type"] == "message_delta")
    assert ending["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert ending["usage"]["output_tokens"] > 0
    assert "timings" not in received[-1]


def test_anthropic_count_tokens(http: httpx.Client) -> None:
    response = post(http, "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "Hello world"}]})
    assert response.status_code == 200, response.text
    counted = response.json()
    assert isinstance(counted["input_tokens"], int)
    assert counted["input_tokens"] > 0
    assert "output_tokens" not in counted


def test_anthropic_count_tokens_with_system(http: httpx.Client, vocab: llamactx.LlamaModel) -> None:
    # llama.cpp's asks for a positive count; with a system prompt the template adds nothing of its own.
    system, user = "You are a helpful assistant.", "Hello"
    response = post(
        http, "/v1/messages/count_tokens", {"system": system, "messages": [{"role": "user", "content": user}]}
    )
    assert response.status_code == 200, response.text
    expected = chat_tokens(vocab, [{"role": "system", "content": system}, {"role": "user", "content": user}])
    assert response.json()["input_tokens"] == expected


def test_anthropic_tool_use_basic(http: httpx.Client) -> None:
    answer = message(
        http,
        max_tokens=200,
        tools=[WEATHER_TOOL],
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
    )
    assert answer["content"]
    calls = [block for block in answer["content"] if block["type"] == "tool_use"]
    if calls:  # whether the model calls the tool is its choice
        assert answer["stop_reason"] == "tool_use"
        assert calls[0]["id"]
        assert calls[0]["name"] == "get_weather"
        assert isinstance(calls[0]["input"], dict)


@pytest.mark.parametrize(
    "result",
    [
        [{"type": "tool_result", "tool_use_id": "test123", "content": "The weather is sunny, 25°C"}],
        [
            {"type": "text", "text": "Here are the results:"},
            {"type": "tool_result", "tool_use_id": "test123", "content": "Sunny, 25°C"},
        ],
        [{"type": "tool_result", "tool_use_id": "test123", "is_error": True, "content": "City not found"}],
    ],
    ids=["result", "text-and-result", "error-result"],
)
def test_anthropic_tool_result(http: httpx.Client, result: list[dict[str, Any]]) -> None:
    answer = message(http, max_tokens=16, messages=tool_exchange(result))
    assert answer["content"]
    assert answer["content"][0]["type"] == "text"


def test_anthropic_tool_streaming(http: httpx.Client) -> None:
    calculator = {
        "name": "calculator",
        "description": "Calculate math",
        "input_schema": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    }
    received = stream(http, max_tokens=64, tools=[calculator], messages=[{"role": "user", "content": "Calculate 2+2"}])
    kinds = [event["type"] for event in received]
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    for event in received:
        if event["type"] == "content_block_start" and event["content_block"]["type"] == "tool_use":
            assert isinstance(event["index"], int)
            assert event["content_block"]["name"] == "calculator"


def test_anthropic_vision_format_refused_without_vision(http: httpx.Client) -> None:
    # llama-server answers 500 ("image input is not supported"); a request the model cannot serve
    # is the client's error (4xx), and says so.
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": RED_PIXEL_PNG}}
    content = [image, {"type": "text", "text": "What is this?"}]
    response = post(http, "/v1/messages", {"max_tokens": 10, "messages": [{"role": "user", "content": content}]})
    assert 400 <= response.status_code < 500, response.text
    assert "image" in response.json()["error"]["message"].lower()


def test_anthropic_stop_sequences(http: httpx.Client) -> None:
    answer = message(
        http, max_tokens=32, stop_sequences=["\n", "END"], messages=[{"role": "user", "content": "Count to 10"}]
    )
    text = "".join(block["text"] for block in answer["content"] if block["type"] == "text")
    assert "\n" not in text
    assert "END" not in text


@pytest.mark.parametrize("sampling", [{"temperature": 0.5}, {"top_p": 0.9}, {"top_k": 40}], ids=lambda s: next(iter(s)))
def test_anthropic_sampling_parameters(http: httpx.Client, sampling: dict[str, float]) -> None:
    assert message(http, max_tokens=8, messages=[{"role": "user", "content": "Hello"}], **sampling)["content"]


def test_anthropic_missing_messages(http: httpx.Client) -> None:
    # llama.cpp's test takes any error status; a malformed request is a 400.
    response = post(http, "/v1/messages", {"max_tokens": 50})
    assert response.status_code == 400, response.text


def test_anthropic_streaming_content_block_indices(http: httpx.Client) -> None:
    tool = {
        "name": "test_tool",
        "description": "A test tool",
        "input_schema": {"type": "object", "properties": {"param": {"type": "string"}}, "required": ["param"]},
    }
    received = stream(http, max_tokens=64, tools=[tool], messages=[{"role": "user", "content": "Use the test tool"}])
    starts = [event["index"] for event in received if event["type"] == "content_block_start"]
    stops = [event["index"] for event in received if event["type"] == "content_block_stop"]
    assert starts == list(range(len(starts)))
    assert sorted(stops) == starts


@pytest.mark.parametrize(
    "extra",
    [{"thinking": {"type": "enabled", "budget_tokens": 50}}, {"metadata": {"user_id": "test_user_123"}}],
    ids=["thinking", "metadata"],
)
def test_anthropic_accepted_parameters(http: httpx.Client, extra: dict[str, Any]) -> None:
    message(http, max_tokens=8, messages=[{"role": "user", "content": "What is 2+2?"}], **extra)


def test_anthropic_vs_openai_different_response_format(http: httpx.Client) -> None:
    body = {"model": "test", "max_tokens": 8, "messages": [{"role": "user", "content": "Hello"}]}
    openai_reply = http.post("/v1/chat/completions", json=body)
    assert openai_reply.status_code == 200, openai_reply.text
    anthropic_reply = message(http, **body)
    assert openai_reply.json()["object"] == "chat.completion"
    assert "choices" in openai_reply.json()
    assert "content" in anthropic_reply
    assert {"prompt_tokens", "completion_tokens"} <= openai_reply.json()["usage"].keys()
    assert {"input_tokens", "output_tokens"} <= anthropic_reply["usage"].keys()


def test_anthropic_streaming_a_reply_that_opens_with_an_emoji(http: httpx.Client) -> None:
    """Not in llama.cpp's tests: the stream's events when the reply's first character takes more
    than one token (this greedy reply opens with an emoji)."""
    received = stream(http, max_tokens=8, messages=[{"role": "user", "content": "Say hello with an emoji first."}])
    kinds = [event["type"] for event in received]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-1] == "message_stop"
    text = "".join(event["delta"]["text"] for event in received if event["type"] == "content_block_delta")
    assert text
    assert not text.isascii()
