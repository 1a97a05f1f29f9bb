"""Constraints on what is generated: JSON Schemas (dicts, JSON text, pydantic models,
dataclasses, TypedDicts) and grammars, as the sampler stages that enforce them, with the check
of what a schema asks that llguidance cannot enforce (``OutputCheck``). A leaf module: every
generation path imports it, and it imports none of them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from llamactx._llamactx import LlamaModel, LlamaSampler
from llamactx._schema_check import OutputCheck

__all__ = [
    "LARK_MARKER",
    "Constraint",
    "JsonSchema",
    "Stage",
    "closed",
    "constrained",
    "constraint",
    "constraint_stage",
    "schema_text",
    "type_adapter",
]

#: What ``json_schema=`` takes: a JSON Schema as a dict or JSON text, or a class whose schema
#: pydantic derives (a pydantic model, a dataclass, a TypedDict).
JsonSchema = Mapping[str, Any] | str | bool | type

#: A grammar starting with this is llguidance's Lark dialect, as llama.cpp marks it; any other
#: grammar is GBNF. Both compile with llguidance, which bounds the work of every step (GBNF is
#: translated to Lark: crates/llamactx-engine/src/sampler/guidance/gbnf.rs).
LARK_MARKER = "%llguidance"


def schema_text(schema: JsonSchema) -> str:
    """``schema`` as JSON Schema text; a class's schema comes from pydantic, closed to keys
    other than its fields."""
    if isinstance(schema, str):
        return schema
    if isinstance(schema, bool | Mapping):
        return json.dumps(schema)
    if isinstance(schema, type):
        return json.dumps(closed(type_adapter(schema).json_schema()))
    raise TypeError(
        f"json_schema takes a dict, JSON text, or a pydantic model / dataclass / TypedDict class, "
        f"not {type(schema).__name__}"
    )


# Keywords whose value is a subschema, a list of them, or a map of names to them.
_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "unevaluatedItems")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that does not say: a
    class instance keeps only its fields and a function takes only its parameters, so extra keys
    would only cost tokens (a small model invents them until ``max_tokens``)."""
    if not isinstance(schema, dict):
        return schema
    schema = dict(schema)
    for key in _SUBSCHEMA:
        if key in schema:
            schema[key] = closed(schema[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            schema[key] = [closed(item) for item in schema[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            schema[key] = {name: closed(sub) for name, sub in schema[key].items()}
    if "properties" in schema and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    return schema


def type_adapter(cls: type) -> Any:
    try:
        import pydantic
    except ImportError as err:  # pragma: no cover - pydantic comes with the server extra
        raise TypeError(f"a class as json_schema needs pydantic (pip install pydantic): {cls.__name__}") from err
    if not (isinstance(cls, type) and issubclass(cls, pydantic.BaseModel)) and not (
        dataclasses.is_dataclass(cls) or _is_typed_dict(cls)
    ):
        raise TypeError(f"json_schema takes a pydantic model, a dataclass or a TypedDict class, not {cls.__name__}")
    return pydantic.TypeAdapter(cls)


def _is_typed_dict(cls: type) -> bool:
    return issubclass(cls, dict) and hasattr(cls, "__required_keys__")


class Constraint(NamedTuple):
    """The one constraint given: ``spec`` is ``(kind, text)`` ("json_schema", "lark" for a
    grammar marked ``%llguidance``, or "gbnf"), a sampler given as the grammar itself, or None;
    ``check`` validates a JSON Schema's finished output (``OutputCheck``)."""

    spec: tuple[str, str] | LlamaSampler | None
    check: OutputCheck | None = None


class Stage(NamedTuple):
    """A constraint compiled: the sampler stage (None without a constraint) and its check."""

    sampler: LlamaSampler | None
    check: OutputCheck | None = None


def constraint(
    json_schema: JsonSchema | None, grammar: str | LlamaSampler | None, *, checked: bool = True
) -> Constraint:
    """The constraint of ``json_schema`` or ``grammar``. ``checked``: llguidance enforces what it
    can of a JSON Schema, and the check the rest; without, llguidance must enforce all of it
    (``SchemaError`` otherwise)."""
    if json_schema is not None and grammar is not None:
        raise ValueError("give json_schema or grammar, not both")
    if json_schema is not None:
        text = schema_text(json_schema)
        check = OutputCheck.of(text) if checked else None
        return Constraint(("json_schema", text if check is None else check.constraint_text), check)
    if isinstance(grammar, str):
        return Constraint(("lark" if grammar.lstrip().startswith(LARK_MARKER) else "gbnf", grammar))
    return Constraint(grammar)


def constraint_stage(
    model: LlamaModel,
    json_schema: JsonSchema | None,
    grammar: str | LlamaSampler | None,
    *,
    checked: bool = True,
) -> Stage:
    """The sampler stage that masks what the constraint cannot take (compiled once here, then
    copied by each user), with its check (``constraint``)."""
    spec, check = constraint(json_schema, grammar, checked=checked)
    if spec is None or isinstance(spec, LlamaSampler):
        return Stage(spec)
    kind, text = spec
    return Stage(LlamaSampler.llguidance(model, kind, text), check)


def constrained(
    model: LlamaModel, sampler: LlamaSampler | None, json_schema: JsonSchema | None, grammar: str | None
) -> Stage:
    """``sampler`` (greedy when None) behind the constraint, which masks the candidates first;
    ``sampler`` itself when there is no constraint."""
    stage, check = constraint_stage(model, json_schema, grammar)
    if stage is None:
        return Stage(sampler)
    return Stage(LlamaSampler.chain([stage, sampler if sampler is not None else LlamaSampler.greedy()]), check)
