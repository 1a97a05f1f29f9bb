"""Tool-call formats llama.cpp recognizes by their templates, beyond ``<tool_call>``: the real
model's weights with a template in Functionary v3.2's recipient format, whose lazy grammar is
triggered by a look-ahead pattern (``>>>(?!all)``) that a linear regex engine cannot run: the
chat works with tools, the grammar constrains a call from its name on, and llama.cpp's parser
reads the call back."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import numpy as np
import pytest
from support.prompts import RECIPIENTS_TEMPLATE
from support.tool_examples import ASK_WEATHER, WEATHER

import llamactx
from llamactx import LlamaContext, LlamaModel, LlamaSampler


@pytest.fixture(scope="module")
def engine(model: LlamaModel) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(model, n_ctx=1024, n_seq_max=1, chat_template=RECIPIENTS_TEMPLATE) as recipients:
        yield recipients


def allowed(sampler: LlamaSampler, ctx: LlamaContext) -> set[str]:
    """The pieces the sampler leaves possible among every token of the context's last row."""
    candidates = ctx.candidates_ith(-1)
    sampler.apply(candidates)
    kept = candidates.ids[np.isfinite(candidates.logits)]
    return {ctx.model.token_to_bytes(int(token), True).decode(errors="replace") for token in kept}


def test_the_chat_takes_tools_and_reads_calls_back_with_the_formats_parser(engine: llamactx.Engine) -> None:
    chat = engine.prepare_chat(ASK_WEATHER, tools=[WEATHER], tool_choice="auto")
    assert chat.with_tools
    # The generation prompt ends with ">>>": the reply opens with its recipient.
    (call,) = chat.reply('get_weather\n{"city": "Paris"}')["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert chat.reply("all\nIt is sunny.") == {"role": "assistant", "content": "It is sunny."}


def test_the_lazy_grammar_starts_after_the_recipient_marker(
    engine: llamactx.Engine, model: LlamaModel, paris_ctx: LlamaContext
) -> None:
    """Text is free until ``>>>`` names a recipient; the grammar, which does not take the
    marker itself, then starts after it: a function's name, a newline and its arguments."""
    sampler = engine.prepare_chat(ASK_WEATHER, tools=[WEATHER], tool_choice="auto").sampler
    assert sampler is not None
    everything = len(allowed(LlamaSampler.greedy(), paris_ctx))
    for token in model.str_to_token("all\nLet me check.\n", False):
        sampler.accept(token)
    assert len(allowed(sampler, paris_ctx)) == everything
    sampler.accept(model.str_to_token(">>>", False)[0])
    assert allowed(sampler, paris_ctx) == {"g", "ge", "get"}
    for token in model.str_to_token("get_weather\n", False):
        sampler.accept(token)
    assert allowed(sampler, paris_ctx) == {"{", '{"'}


def test_a_generated_call_follows_its_schema(engine: llamactx.Engine) -> None:
    """Greedy, the model writes a line of text, then ``>>>get_weather`` and arguments the
    grammar keeps to the tool's schema."""
    text = engine.submit_chat(ASK_WEATHER, tools=[WEATHER], tool_choice="auto", max_tokens=40).result().text
    _, marker, call = text.partition(">>>get_weather\n")
    assert marker
    jsonschema.validate(json.loads(call), WEATHER["function"]["parameters"])
