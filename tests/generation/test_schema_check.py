"""JSON Schema keywords llguidance cannot enforce while generating (``uniqueItems``, ``not``,
...): compiled leniently, then every finished value is validated against the whole schema, on
every generation path; a value that breaks one raises ``SchemaError`` naming the keyword."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, Literal

import jsonschema
import pydantic
import pytest
from support.counting_host import counting_host
from support.hostile_constraints import chained_schema, doubling_one_of
from support.prompts import HELPFUL

import llamactx
from llamactx import LlamaModel, LlamaSampler, SchemaError
from llamactx._schema_check import MAX_CHECK_STEPS, OutputCheck

ASK = [{"role": "system", "content": HELPFUL}, {"role": "user", "content": "List three colors as a JSON array."}]
# Three items of two values: every value the constraint admits repeats one.
REPEATING = {"type": "array", "items": {"enum": ["red", "blue"]}, "minItems": 3, "maxItems": 3, "uniqueItems": True}
COLORS = {
    "type": "array",
    "items": {"enum": ["red", "green", "blue"]},
    "minItems": 3,
    "maxItems": 3,
    "uniqueItems": True,
}


def prompt_tokens(model: LlamaModel) -> list[int]:
    with llamactx.Engine(model, n_ctx=512, n_seq_max=1) as engine:
        return engine.chat_tokens(ASK)


def on_context(ctx: llamactx.LlamaContext, schema: Any) -> list[str]:
    return [llamactx.generate(ctx, prompt_tokens(ctx.model), max_tokens=40, json_schema=schema)]


def in_a_batch(ctx: llamactx.LlamaContext, schema: Any) -> list[str]:
    return llamactx.generate_batch(ctx, [prompt_tokens(ctx.model)] * 2, max_tokens=40, json_schema=schema)


def streamed(ctx: llamactx.LlamaContext, schema: Any) -> list[str]:
    pieces: list[str] = []
    try:
        for piece in llamactx.stream(ctx, prompt_tokens(ctx.model), max_tokens=40, json_schema=schema):
            pieces.append(piece)
    except SchemaError:
        assert json.loads("".join(pieces))  # raised after the whole value was yielded
        raise
    return ["".join(pieces)]


def engine_result(ctx: llamactx.LlamaContext, schema: Any) -> list[str]:
    with llamactx.Engine(ctx.model, n_ctx=1024, n_seq_max=2) as engine:
        return [engine.submit_chat(ASK, max_tokens=40, json_schema=schema).result().text]


def engine_iteration(ctx: llamactx.LlamaContext, schema: Any) -> list[str]:
    with llamactx.Engine(ctx.model, n_ctx=1024, n_seq_max=2) as engine:
        return ["".join(engine.submit_chat(ASK, max_tokens=40, json_schema=schema))]


def engine_awaited(ctx: llamactx.LlamaContext, schema: Any) -> list[str]:
    async def both(engine: llamactx.Engine) -> list[str]:
        awaited = await engine.submit_chat(ASK, max_tokens=40, json_schema=schema)
        iterated = "".join([piece async for piece in engine.submit_chat(ASK, max_tokens=40, json_schema=schema)])
        return [awaited.text, iterated]

    with llamactx.Engine(ctx.model, n_ctx=1024, n_seq_max=2) as engine:
        return asyncio.run(both(engine))


def as_json(ctx: llamactx.LlamaContext, schema: Any) -> list[str]:
    return [json.dumps(llamactx.generate_json(ctx, ASK, schema, max_tokens=40))]


PATHS: list[Callable[[llamactx.LlamaContext, Any], list[str]]] = [
    on_context,
    in_a_batch,
    streamed,
    engine_result,
    engine_iteration,
    engine_awaited,
    as_json,
]


@pytest.mark.parametrize("path", PATHS, ids=lambda path: path.__name__)
def test_a_value_that_breaks_a_keyword_left_to_the_check_raises_naming_it(
    ctx: llamactx.LlamaContext, path: Callable[[llamactx.LlamaContext, Any], list[str]]
) -> None:
    with pytest.raises(SchemaError) as raised:
        path(ctx, REPEATING)
    assert raised.value.kind == "Unsatisfied"
    assert "'uniqueItems' at $" in str(raised.value)


@pytest.mark.parametrize("path", PATHS, ids=lambda path: path.__name__)
def test_a_value_that_keeps_it_is_returned_the_same_on_every_path(
    ctx: llamactx.LlamaContext, path: Callable[[llamactx.LlamaContext, Any], list[str]]
) -> None:
    # llguidance refuses the schema itself: only the check holds uniqueItems.
    with pytest.raises(SchemaError, match="uniqueItems"):
        LlamaSampler.llguidance(ctx.model, "json_schema", json.dumps(COLORS))
    texts = path(ctx, COLORS)
    for text in texts:
        value = json.loads(text)
        jsonschema.validate(value, COLORS)
        assert sorted(value) == ["blue", "green", "red"]
    assert {json.dumps(json.loads(text)) for text in texts} == {json.dumps(json.loads(on_context(ctx, COLORS)[0]))}


def test_a_value_cut_by_max_tokens_is_not_judged(ctx: llamactx.LlamaContext) -> None:
    text = llamactx.generate(ctx, prompt_tokens(ctx.model), max_tokens=3, json_schema=REPEATING)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


class Palette(pydantic.BaseModel):
    colors: set[Literal["red", "green", "blue"]] = pydantic.Field(min_length=3, max_length=3)


def test_a_pydantic_set_field_is_generated_instead_of_refused(ctx: llamactx.LlamaContext) -> None:
    assert Palette.model_json_schema()["properties"]["colors"]["uniqueItems"] is True
    palette = llamactx.generate_json(ctx, ASK, Palette, max_tokens=40)
    assert palette.colors == {"red", "green", "blue"}


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "integer", "minimum": 0, "maximum": 3, "not": {"enum": [0, 1, 2, 3]}}, "not"),
        (
            {"type": "array", "items": {"type": "integer", "maximum": 9}, "maxItems": 3, "contains": {"const": 10}},
            "contains",
        ),
        ({"oneOf": [{"type": "integer", "maximum": 9}, {"type": "integer", "maximum": 9}]}, "oneOf"),
    ],
)
def test_other_keywords_left_to_the_check_are_named(
    ctx: llamactx.LlamaContext, schema: dict[str, Any], keyword: str
) -> None:
    """Each schema admits no value at all (an integer from 0 to 3 that is none of them, an array
    of digits that holds 10, an integer only one of two equal branches admits), so the check
    names the keyword whatever the model writes."""
    with pytest.raises(SchemaError, match=f"'{keyword}' at \\$"):
        llamactx.generate(ctx, prompt_tokens(ctx.model), max_tokens=40, json_schema=schema)


def test_tool_parameters_must_be_held_by_llguidance_alone(model: LlamaModel) -> None:
    """A tool call's arguments are parsed, not validated: their schema is compiled strictly."""
    tool = {
        "type": "function",
        "function": {
            "name": "paint",
            "parameters": {
                "type": "object",
                "properties": {"colors": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
            },
        },
    }
    with llamactx.Engine(model, n_ctx=1024, n_seq_max=1) as engine, pytest.raises(SchemaError, match="uniqueItems"):
        engine.submit_chat(ASK, tools=[tool])


def test_a_schema_jsonschema_finds_invalid_is_refused_before_decoding(ctx: llamactx.LlamaContext) -> None:
    before = ctx.kv_cache_seq_pos_max(0)
    with pytest.raises(SchemaError) as raised:
        llamactx.generate(ctx, "Hello", max_tokens=4, json_schema={"type": "array", "minItems": -1})
    assert raised.value.kind == "InvalidSchema"
    assert ctx.kv_cache_seq_pos_max(0) == before


def test_hostile_schemas_are_checked_in_bounded_time() -> None:
    """Schemas come from requests: the check's regular expressions never backtrack, and schemas
    or values deeper than Python's recursion are refused, not crashed on."""
    backtracking = "^(a+)+$"  # Python's re takes minutes on 40 a's and a "!"
    started = time.perf_counter()
    check = OutputCheck({"type": "string", "not": {"pattern": backtracking}}, "")
    check.validate(json.dumps("a" * 40 + "!"))
    keys = OutputCheck({"patternProperties": {backtracking: {"type": "integer"}}, "additionalProperties": False}, "")
    with pytest.raises(SchemaError, match="'additionalProperties' at \\$"):
        keys.validate(json.dumps({"a" * 40 + "!": 1}))
    assert time.perf_counter() - started < 5
    with pytest.raises(SchemaError, match="unevaluatedProperties") as raised:
        OutputCheck({"unevaluatedProperties": False, "patternProperties": {backtracking: {}}}, "")
    assert raised.value.kind == "Unsupported"
    nested: dict[str, Any] = {}
    for _ in range(5000):
        nested = {"not": nested}
    with pytest.raises(SchemaError, match="nested too deeply"):
        OutputCheck(nested, "")
    with pytest.raises(SchemaError, match="leads outside the schema"):
        OutputCheck({"$ref": "https://example.com/schema.json"}, "")


@pytest.mark.parametrize("keyword", ["$ref", "$dynamicRef", "$recursiveRef"])
def test_a_reference_outside_the_schema_is_refused_and_nothing_is_fetched(keyword: str) -> None:
    """jsonschema's default registry GETs any URL a reference names (llguidance ignores
    ``$dynamicRef``, so the check after generation did, and used the answer as a schema)."""
    with counting_host() as host:
        for reference in (f"{host.url}/schema.json", f"{host.url}/schema.json#/$defs/x"):
            with pytest.raises(SchemaError, match="leads outside the schema") as raised:
                OutputCheck({"type": "integer", keyword: reference}, "")
            assert raised.value.kind == "Unsupported"
        # Relative to an $id naming the host: still another document.
        with pytest.raises(SchemaError, match="leads outside the schema"):
            OutputCheck({"$id": f"{host.url}/root.json", keyword: "other.json"}, "")
        assert host.paths == []


def test_references_into_the_schemas_own_documents_resolve() -> None:
    embedded = {
        "$id": "https://schemas.example/root.json",
        "$defs": {"digit": {"$id": "digit.json", "type": "integer", "minimum": 0, "maximum": 9}, "word": {}},
        "type": "array",
        "prefixItems": [{"$ref": "digit.json"}, {"$ref": "#/$defs/word"}, {"$ref": "root.json#/$defs/digit"}],
    }
    check = OutputCheck(embedded, "")
    check.validate("[1, 2, 3]")
    with pytest.raises(SchemaError, match="'maximum' at \\$\\[0\\]"):
        check.validate("[10, 2, 3]")


def test_a_check_whose_work_doubles_with_nesting_stops_at_its_budget() -> None:
    check = OutputCheck(doubling_one_of(24), "")
    started = time.perf_counter()
    with pytest.raises(SchemaError, match=f"more than {MAX_CHECK_STEPS} steps") as raised:
        check.validate("true")
    assert raised.value.kind == "TooLarge"
    over_budget = time.perf_counter() - started
    # Within budget, the same check judges: both branches admit the value, so oneOf refuses it.
    with pytest.raises(SchemaError, match="'oneOf'"):
        OutputCheck(doubling_one_of(8), "").validate("true")
    # An ordinary value of 2,000 records fits the budget many times over.
    records = {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}}}}
    OutputCheck(records, "").validate(json.dumps([{"id": index} for index in range(2000)]))
    assert over_budget < 10, f"the check ran {over_budget:.1f} s before its budget stopped it"


def test_a_schema_too_large_to_compile_is_refused_before_it_is_checked(
    model: LlamaModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llguidance's size limit, one pass over the text, comes before the check of the schema
    against the JSON Schema meta-schema, which took 27 s for this one."""
    checked: list[object] = []
    monkeypatch.setattr(jsonschema.validators, "validator_for", lambda *args, **kwargs: checked.append(args))
    with (
        llamactx.Engine(model, n_ctx=512, n_seq_max=1) as engine,
        pytest.raises(SchemaError, match="20002 references") as raised,
    ):
        engine.submit_chat(ASK, json_schema=chained_schema(20_001))
    assert raised.value.kind == "TooLarge"
    assert checked == []
