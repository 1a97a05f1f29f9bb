"""A thinking model's reasoning (``Reasoning``): split out of the reply by llama.cpp's parser for
the chat's template, bounded by llama.cpp's reasoning-budget sampler, and split as a reply
streams. The real model's weights with ``THINKING_TEMPLATE``, whose generation prompt opens a
``<think>`` block: the model never closes it itself, so the budget decides where it ends."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.prompts import THINKING_TEMPLATE, THINKING_TOOLS_TEMPLATE
from support.tool_examples import ASK_WEATHER, WEATHER

import llamactx

ASK: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def engine(model: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(model, n_ctx=1024, n_seq_max=2, chat_template=THINKING_TEMPLATE) as thinking:
        yield thinking


def test_the_reply_is_split_by_the_templates_parser(engine: llamactx.Engine) -> None:
    """What llama.cpp's parser makes of a reply, in each format: the block's text is the
    reasoning (the template opened it), what follows the content; "none" keeps it all as
    content, tags included; a block not closed yet is all reasoning."""
    text = "Paris is in France.\n</think>\n\nParis."
    chat = engine.prepare_chat(ASK)
    assert chat.reply(text) == {"role": "assistant", "content": "Paris.", "reasoning_content": "Paris is in France.\n"}
    assert chat.reply("Still thinking") == {"role": "assistant", "content": "", "reasoning_content": "Still thinking"}
    for format in ("deepseek", "deepseek-legacy"):
        assert engine.prepare_chat(ASK, reasoning=llamactx.Reasoning(format)).reply(text) == chat.reply(text)
    unsplit = engine.prepare_chat(ASK, reasoning=llamactx.Reasoning("none")).reply(text)
    assert unsplit == {"role": "assistant", "content": "<think>\n" + text}


def test_a_template_without_reasoning_has_no_budget_and_no_split(model: llamactx.LlamaModel) -> None:
    with llamactx.Engine(model, n_ctx=512, n_seq_max=1) as plain:
        chat = plain.prepare_chat(ASK, reasoning=llamactx.Reasoning(budget=4))
    assert chat.reasoning_budget is None
    assert chat.stream_parser is None
    assert chat.reply("<think>a</think>b") == {"role": "assistant", "content": "<think>a</think>b"}


def test_reasoning_options_are_checked_when_made() -> None:
    assert llamactx.REASONING_FORMATS == ("none", "auto", "deepseek", "deepseek-legacy")
    with pytest.raises(ValueError, match="reasoning_format must be one of"):
        llamactx.Reasoning("think")
    with pytest.raises(ValueError, match="at least 0 tokens, got -1"):
        llamactx.Reasoning(budget=-1)
    assert llamactx.Reasoning(budget=0).budget == 0


def test_the_budget_forces_the_closing_tag_after_that_many_tokens(
    engine: llamactx.Engine, model: llamactx.LlamaModel
) -> None:
    """Unbounded, the model reasons to its end of turn; with a budget of 3 it reasons the same
    3 tokens, then llama.cpp's sampler forces ``</think>`` and the model answers after it."""
    unbounded = engine.submit_chat(ASK, max_tokens=24)
    free = unbounded.result()
    assert "</think>" not in free.text
    assert unbounded.message() == {"role": "assistant", "content": "", "reasoning_content": free.text}
    bounded = engine.submit_chat(ASK, max_tokens=24, reasoning=llamactx.Reasoning(budget=3))
    completion = bounded.result()
    closing = model.str_to_token("</think>", False)
    assert completion.tokens[:3] == free.tokens[:3]
    assert completion.tokens[3 : 3 + len(closing)] == closing
    message = bounded.message()
    assert message["reasoning_content"] == model.detokenize(free.tokens[:3], False)
    assert message["content"].strip()


def test_a_budget_of_zero_closes_the_block_at_once_and_a_message_comes_before_the_tag(
    engine: llamactx.Engine,
) -> None:
    at_once = engine.submit_chat(ASK, max_tokens=16, reasoning=llamactx.Reasoning(budget=0))
    assert at_once.result().text.startswith("</think>")
    assert "reasoning_content" not in at_once.message()
    assert at_once.message()["content"].strip()
    told = engine.submit_chat(ASK, max_tokens=16, reasoning=llamactx.Reasoning(budget=1, budget_message=" Enough."))
    assert " Enough.</think>" in told.result().text
    assert told.message()["reasoning_content"].endswith(" Enough.")


def test_a_json_schema_constrains_the_reply_from_its_first_token_so_no_budget_applies(
    engine: llamactx.Engine,
) -> None:
    """The budget's forced tag would fight the schema's grammar: with a schema, the reply is
    JSON (the schema holds it from the first token, inside the block the template opened)."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    request = engine.submit_chat(ASK, max_tokens=24, json_schema=schema, reasoning=llamactx.Reasoning(budget=0))
    assert request.result().text.startswith("{")
    assert "</think>" not in request.result().text


def test_a_streamed_reply_splits_as_the_whole_reply_does(engine: llamactx.Engine) -> None:
    """Each piece's deltas, joined, are the whole reply's reasoning and content; the reasoning
    comes first, and no delta shows a piece of the closing tag."""
    chat = engine.prepare_chat(ASK, reasoning=llamactx.Reasoning(budget=3))
    request = engine.submit_prepared(chat, max_tokens=24)
    stream = chat.reply_stream()
    assert stream.splits_reasoning
    deltas = [delta for piece in request for delta in stream.feed(piece).items()]
    deltas += stream.rest(request.message()).items()
    joined = {key: "".join(text for name, text in deltas if name == key) for key in ("reasoning_content", "content")}
    message = request.message()
    assert joined == {"reasoning_content": message["reasoning_content"], "content": message["content"]}
    kinds = [name for name, _ in deltas]
    assert kinds == sorted(kinds, key=("reasoning_content", "content").index)
    assert not any("<" in text or ">" in text for _, text in deltas)
    inline = engine.prepare_chat(ASK, reasoning=llamactx.Reasoning("deepseek-legacy")).reply_stream()
    assert not inline.splits_reasoning
    assert inline.feed("a</think>") == {"content": "a</think>"}


def test_chat_chat_sessions_and_the_chat_command_bound_reasoning_as_the_engine(
    model: llamactx.LlamaModel, model_path: Path, tmp_path: Path
) -> None:
    """The same budget in ``chat``, ``ChatSession`` and ``llamactx chat --reasoning-budget``:
    the reasoning closes after 3 tokens, the reply equal to the engine's (one sequence each)."""
    budget = llamactx.Reasoning(budget=3)
    with llamactx.Engine(model, n_ctx=512, n_seq_max=1, chat_template=THINKING_TEMPLATE) as one:
        expected = one.submit_chat(ASK, max_tokens=24, reasoning=budget).result().text
        unbounded = one.submit_chat(ASK, max_tokens=24).result().text
    assert "</think>" in expected
    assert "</think>" not in unbounded
    ctx = model.new_context(n_ctx=512)
    reply = llamactx.chat(ctx, ASK, max_tokens=24, chat_template=THINKING_TEMPLATE, reasoning=budget)
    assert reply == expected
    session = llamactx.ChatSession(ctx, max_tokens=24, chat_template=THINKING_TEMPLATE, reasoning=budget)
    assert "".join(session.send(ASK[0]["content"])) == expected
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    command = [sys.executable, "-m", "llamactx", "chat", "-m", str(model_path), "--greedy", "--max-tokens", "24"]
    options = ["--chat-template-file", str(template), "--reasoning-budget", "3", ASK[0]["content"]]
    printed = subprocess.run([*command, *options], capture_output=True, text=True, timeout=120, check=True)
    assert printed.stdout.rstrip("\n") == expected.rstrip("\n")


def test_a_thinking_templates_tool_grammar_waits_for_the_reasoning_to_end(model: llamactx.LlamaModel) -> None:
    """With tools, a template that thinks and formats calls (llama.cpp's triggers and parser for
    it): a ``<tool_call>`` written while the model reasons is text, not a call; after
    ``</think>`` a call is held to the offered tools, and the reply splits into the reasoning and
    the call."""
    with llamactx.Engine(model, n_ctx=2048, n_seq_max=1, chat_template=THINKING_TOOLS_TEMPLATE) as engine:
        chat = engine.prepare_chat(ASK_WEATHER, tools=[WEATHER], tool_choice="auto")
        assert chat.sampler is not None
        reasoning = "I could write <tool_call> and then anything.\n"
        call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        text = f"{reasoning}</think>\n\n{call}"
        for token in model.str_to_token(text, False):
            chat.sampler.accept(token)
        message = chat.reply(text)
        assert message["reasoning_content"] == reasoning
        (made,) = message["tool_calls"]
        assert made["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
        other = engine.prepare_chat(ASK_WEATHER, tools=[WEATHER], tool_choice="auto").sampler
        assert other is not None
        for token in model.str_to_token('Think.\n</think>\n\n<tool_call>\n{"name": "get_', False):
            other.accept(token)
        (time,) = model.str_to_token("time", False)  # get_time is not among the tools
        with pytest.raises(llamactx.LlamaCppError):
            other.accept(time)
        # The real model under the budget: its reply parses whole, the reasoning split out.
        replied = engine.submit_chat(
            ASK_WEATHER, tools=[WEATHER], max_tokens=40, reasoning=llamactx.Reasoning(budget=4)
        ).message()
        assert replied["reasoning_content"]
        for made in replied.get("tool_calls") or ():
            assert made["function"]["name"] == "get_weather"
            json.loads(made["function"]["arguments"])
