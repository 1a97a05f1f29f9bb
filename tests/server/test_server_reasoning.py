"""A thinking model's reasoning on every API the server speaks, through the official clients:
OpenAI's ``reasoning_content`` (streamed as deltas of its own), Anthropic's ``thinking`` blocks
and the Responses API's ``reasoning`` items, each equal to the engine's split of the same reply,
streamed or not; the server's ``Reasoning`` (``serve --reasoning-*``) and a request's own
``reasoning_format`` or ``thinking.budget_tokens`` over it. The real model's weights with
``THINKING_TEMPLATE``, in process (``create_app``): the budget decides where its reasoning
ends, since the model never closes the block itself."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import httpx
import httpx2
import openai
import pytest
from support.prompts import THINKING_TEMPLATE
from support.serving import running_server

import llamactx
from llamactx.server import create_app

ASK: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
#: The server's: 3 tokens of reasoning, then the answer.
BUDGET = 3
Result = TypeVar("Result")


@pytest.fixture(scope="module")
def engine(model: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(
        model, n_ctx=2048, n_seq_max=2, prefix_cache=False, chat_template=THINKING_TEMPLATE
    ) as thinking:
        yield thinking


@pytest.fixture(scope="module")
def expected(engine: llamactx.Engine) -> dict[str, Any]:
    """The engine's greedy reply under the server's budget, as OpenAI's message."""
    return engine.submit_chat(ASK, max_tokens=24, reasoning=llamactx.Reasoning(budget=BUDGET)).message()


def served(
    engine: llamactx.Engine,
    call: Callable[[openai.AsyncOpenAI, anthropic.AsyncAnthropic], Awaitable[Result]],
) -> Result:
    """``call``'s result on an app with the server's reasoning budget, through both clients."""
    app = create_app(engine, model_id="thinker", reasoning=llamactx.Reasoning(budget=BUDGET))

    async def run() -> Result:
        async with (
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http,
            httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as http2,
            openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http) as client,
            anthropic.AsyncAnthropic(base_url="http://test", api_key="unused", http_client=http2) as messages,
        ):
            return await call(client, messages)

    return asyncio.run(run())


def test_chat_completions_carry_the_reasoning_streamed_or_not(
    engine: llamactx.Engine, expected: dict[str, Any]
) -> None:
    assert expected["reasoning_content"]
    assert expected["content"]

    async def call(client: openai.AsyncOpenAI, _: anthropic.AsyncAnthropic) -> tuple[Any, list[tuple[str, str]]]:
        whole = await client.chat.completions.create(model="thinker", messages=ASK, max_tokens=24, temperature=0)
        chunks = await client.chat.completions.create(
            model="thinker", messages=ASK, max_tokens=24, temperature=0, stream=True
        )
        deltas = []
        async for chunk in chunks:
            for key, value in (chunk.choices[0].delta.model_extra or {}).items():
                deltas.append((key, value))
            if chunk.choices[0].delta.content:
                deltas.append(("content", chunk.choices[0].delta.content))
        return whole.choices[0].message, deltas

    message, deltas = served(engine, call)
    assert message.content == expected["content"]
    assert (message.model_extra or {})["reasoning_content"] == expected["reasoning_content"]
    assert "".join(text for key, text in deltas if key == "reasoning_content") == expected["reasoning_content"]
    assert "".join(text for key, text in deltas if key == "content") == expected["content"]
    # Token by token: the reasoning's deltas first, then the content's.
    assert [key for key, _ in deltas] == ["reasoning_content"] * BUDGET + ["content"] * (len(deltas) - BUDGET)


def test_a_requests_reasoning_format_replaces_the_servers(engine: llamactx.Engine, expected: dict[str, Any]) -> None:
    async def call(client: openai.AsyncOpenAI, _: anthropic.AsyncAnthropic) -> tuple[Any, Any]:
        unsplit = await client.chat.completions.create(
            model="thinker", messages=ASK, max_tokens=24, temperature=0, extra_body={"reasoning_format": "none"}
        )
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="thinker", messages=ASK, max_tokens=2, extra_body={"reasoning_format": "think"}
            )
        return unsplit.choices[0].message, refused.value.body

    message, refusal = served(engine, call)
    assert message.content == f"<think>\n{expected['reasoning_content']}</think>{expected['content']}"
    assert "reasoning_content" not in (message.model_extra or {})
    assert refusal["param"] == "reasoning_format"
    assert "must be one of" in refusal["message"]


def test_anthropic_replies_open_with_a_thinking_block(engine: llamactx.Engine, expected: dict[str, Any]) -> None:
    """Whole and streamed, the reasoning is a thinking block before the text; a request's
    ``thinking.budget_tokens`` replaces the server's budget."""

    async def call(_: openai.AsyncOpenAI, messages: anthropic.AsyncAnthropic) -> list[Any]:
        greedy: Any = {"temperature": 0}
        whole = await messages.messages.create(model="thinker", messages=ASK, max_tokens=24, extra_body=greedy)
        async with messages.messages.stream(model="thinker", messages=ASK, max_tokens=24, extra_body=greedy) as stream:
            streamed = await stream.get_final_message()
        one = await messages.messages.create(
            model="thinker",
            messages=ASK,
            max_tokens=24,
            thinking={"type": "enabled", "budget_tokens": 1},
            extra_body=greedy,
        )
        return [whole, streamed, one]

    whole, streamed, one = served(engine, call)
    blocks = [
        {"type": "thinking", "thinking": expected["reasoning_content"], "signature": ""},
        {"type": "text", "text": expected["content"], "citations": None},
    ]
    assert [block.model_dump() for block in whole.content] == blocks
    assert [block.model_dump() for block in streamed.content] == blocks
    assert one.content[0].type == "thinking"
    assert one.content[0].thinking == expected["reasoning_content"].split()[0]


def test_responses_output_a_reasoning_item_before_the_message(
    engine: llamactx.Engine, expected: dict[str, Any], model: llamactx.LlamaModel
) -> None:
    """Whole and streamed; its tokens are counted as reasoning tokens; the output sent back as
    input continues the conversation, the reasoning item as that turn's reasoning; and
    ``reasoning.effort`` reaches the template."""

    async def call(client: openai.AsyncOpenAI, _: anthropic.AsyncAnthropic) -> list[Any]:
        options: Any = {"model": "thinker", "max_output_tokens": 24, "temperature": 0}
        whole = await client.responses.create(input=ASK[0]["content"], **options)
        async with client.responses.stream(input=ASK[0]["content"], **options) as stream:
            streamed = await stream.get_final_response()
        follow_up = [*whole.output, {"role": "user", "content": "And of Spain?"}]
        continued = await client.responses.create(input=follow_up, **{**options, "max_output_tokens": 4})
        effort = await client.responses.create(
            input=ASK[0]["content"], reasoning={"effort": "low"}, **{**options, "max_output_tokens": 1}
        )
        return [whole, streamed, continued, effort]

    whole, streamed, continued, effort = served(engine, call)
    # reasoning.effort is the template's reasoning_effort, as llama-server's --reasoning-effort.
    assert (
        effort.usage.input_tokens == engine.prepare_chat(ASK, chat_template_kwargs={"reasoning_effort": "low"}).n_tokens
    )
    assert effort.usage.input_tokens > engine.prepare_chat(ASK).n_tokens
    assert effort.reasoning.effort == "low"
    for response in (whole, streamed):
        reasoning, message = response.output
        assert (reasoning.type, message.type) == ("reasoning", "message")
        assert [part.text for part in reasoning.content] == [expected["reasoning_content"]]
        assert response.output_text == expected["content"]
    assert whole.usage.output_tokens_details.reasoning_tokens == len(
        model.str_to_token(expected["reasoning_content"], False)
    )
    # The reasoning item goes back to the template as the earlier turn's reasoning_content (which
    # llama.cpp renders as the template does for a turn before the last).
    earlier = {"role": "assistant", "content": expected["content"], "reasoning_content": expected["reasoning_content"]}
    conversation = [earlier, {"role": "user", "content": "And of Spain?"}]
    assert continued.usage.input_tokens == engine.prepare_chat(conversation).n_tokens


def test_serve_takes_llama_servers_reasoning_options(model_path: Path, expected: dict[str, Any]) -> None:
    """``--reasoning-format``, ``--reasoning-budget`` and ``--reasoning-budget-message`` are in
    ``serve --help`` and reach the app; a budget below -1 is a usage error (status 2) before any
    model loads."""
    shown = subprocess.run([sys.executable, "-m", "llamactx", "serve", "--help"], capture_output=True, text=True)
    for flag in ("--reasoning-format", "--reasoning-budget N", "--reasoning-budget-message"):
        assert flag in shown.stdout
    refused = subprocess.run(
        [sys.executable, "-m", "llamactx", "serve", "--reasoning-budget", "-2", "--model", str(model_path)],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2
    assert "--reasoning-budget takes -1 (unbounded) or more" in refused.stderr
    template = str(Path(__file__).resolve().parents[1] / "support" / "templates" / "thinking.jinja")
    flags = ("--chat-template-file", template, "--reasoning-format", "deepseek", "--reasoning-budget", str(BUDGET))
    with (
        running_server(model_path, "--no-prefix-cache", *flags) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client,
    ):
        reply = client.chat.completions.create(model="thinker", messages=ASK, max_tokens=24, temperature=0)
    assert reply.choices[0].message.content == expected["content"]
    assert (reply.choices[0].message.model_extra or {})["reasoning_content"] == expected["reasoning_content"]
