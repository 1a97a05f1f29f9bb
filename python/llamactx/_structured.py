"""``generate_json``: a value matching a JSON Schema, generated on a context or an engine and
returned parsed and validated. It sits above both generation paths and imports them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, overload

from llamactx._constraints import JsonSchema, schema_text, type_adapter
from llamactx._engine import Engine
from llamactx._generation import stream
from llamactx._llamactx import LlamaContext, SamplingParams
from llamactx._render import ChatRenderer, Message

__all__ = ["generate_json"]

T = TypeVar("T")


@overload
def generate_json(
    target: LlamaContext | Engine,
    prompt: str | Sequence[Message],
    schema: type[T],
    *,
    max_tokens: int = ...,
    sampling: SamplingParams | None = ...,
) -> T: ...
@overload
def generate_json(
    target: LlamaContext | Engine,
    prompt: str | Sequence[Message],
    schema: Mapping[str, Any] | str | bool,
    *,
    max_tokens: int = ...,
    sampling: SamplingParams | None = ...,
) -> Any: ...
def generate_json(
    target: LlamaContext | Engine,
    prompt: str | Sequence[Message],
    schema: JsonSchema,
    *,
    max_tokens: int = 512,
    sampling: SamplingParams | None = None,
) -> Any:
    """Generates a value matching ``schema`` and returns it parsed and validated: an instance
    when ``schema`` is a pydantic model, dataclass or TypedDict (through pydantic), else the
    JSON value (validated against the whole schema with ``jsonschema``, as every output of a
    JSON Schema is).

    ``target`` is a ``LlamaContext`` (sequence 0 is used) or an ``Engine``; ``prompt`` is text,
    or chat messages formatted with the model's chat template. Greedy when ``sampling`` is None.
    ``SchemaError`` for a schema llguidance cannot compile, or for a value that breaks a keyword
    llguidance cannot enforce while generating (``uniqueItems``, ``not``, ...), naming it;
    ``ValueError`` when ``max_tokens`` ends the output before the value is complete.
    """
    text_schema = schema_text(schema)
    if isinstance(target, Engine):
        submit = target.submit if isinstance(prompt, str) else target.submit_chat
        completion = submit(prompt, max_tokens=max_tokens, sampling=sampling, json_schema=text_schema).result()  # type: ignore[arg-type]
        text, complete = completion.text, completion.finish_reason == "stop"
    else:
        text, complete = _generate_on_context(target, prompt, text_schema, max_tokens, sampling)
    if not complete:
        raise ValueError(f"max_tokens={max_tokens} ended the output before the JSON value was complete: {text!r}")
    return _parsed(text, schema)


def _generate_on_context(
    ctx: LlamaContext, prompt: str | Sequence[Message], schema: str, max_tokens: int, sampling: SamplingParams | None
) -> tuple[str, bool]:
    tokens = prompt if isinstance(prompt, str) else ChatRenderer(ctx.model).prepare(prompt).tokens
    sampler = None if sampling is None else sampling.sampler(ctx.model)
    pieces: list[str] = []
    generation = stream(ctx, tokens, max_tokens=max_tokens, sampler=sampler, json_schema=schema)
    while True:
        try:
            pieces.append(next(generation))
        except StopIteration as end:
            return "".join(pieces), end.value == "stop"


def _parsed(text: str, schema: JsonSchema) -> Any:
    """The value of ``text``, which generation validated against the schema (a class's instance
    through pydantic, which may check more than its JSON Schema says)."""
    if isinstance(schema, type):
        return type_adapter(schema).validate_json(text)
    return json.loads(text)
