"""Constraints that once overflowed llguidance's stack, starved the server (issue 27) or froze
its event loop in the check after generation, for the red-team cases, the server's tests and
the fuzzer."""

from __future__ import annotations

from typing import Any


def chained_schema(links: int, *, alias: bool = False) -> dict[str, Any]:
    """A schema whose ``$defs`` chain ``links`` deep, though its JSON nests only a few levels:
    each definition only names the next (``alias``), or is an ``anyOf`` of null or an array of
    the next. llguidance recursed once per link."""

    def link(index: int) -> dict[str, Any]:
        reference = {"$ref": f"#/$defs/d{index + 1}"}
        return reference if alias else {"anyOf": [{"type": "null"}, {"type": "array", "items": reference}]}

    defs = {f"d{index}": link(index) for index in range(links)}
    defs[f"d{links}"] = {"type": "null"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def doubling_one_of(levels: int) -> dict[str, Any]:
    """``levels`` of ``oneOf: [A, A]`` through ``$defs`` (5 KB for 24): jsonschema tries both
    branches at every level, 2**levels keyword applications for a boolean."""
    definitions: dict[str, Any] = {"level0": {"type": "boolean"}}
    for level in range(1, levels + 1):
        twice = {"$ref": f"#/$defs/level{level - 1}"}
        definitions[f"level{level}"] = {"oneOf": [twice, twice]}
    return {"$defs": definitions, "$ref": f"#/$defs/level{levels}"}


def chained_lark(rules: int, fan_out: int = 1) -> str:
    """A Lark grammar ``rules`` rules long, each choosing among ``fan_out`` ways to the next."""
    lines = ["%llguidance {}", "start: r0"]
    lines += [f"r{index}: " + " | ".join(f'"{way}" r{index + 1}' for way in range(fan_out)) for index in range(rules)]
    lines.append(f'r{rules}: "x"')
    return "\n".join(lines)


def wide_schema(properties: int, *, required: bool = False) -> dict[str, Any]:
    """An object of ``properties`` patterned strings (about 60 bytes each): slow to compile."""
    fields = {
        f"field_{index}": {"type": "string", "pattern": f"^[a-z]{{1,{index % 7 + 1}}}$"} for index in range(properties)
    }
    return {"type": "object", "properties": fields, "required": list(fields) if required else []}
