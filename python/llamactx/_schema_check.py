"""JSON Schemas beyond what llguidance enforces: the constraint holds every keyword llguidance
supports, and the finished value is validated against the whole schema.

llguidance refuses a schema with a keyword it cannot enforce while generating (``uniqueItems``,
``contains``, ``not``, ``if``/``then``/``else``, ``dependentRequired``/``dependentSchemas``,
``propertyNames``, ``min/maxProperties`` over optional keys, an unknown ``format``) or a
``oneOf`` (whose branches it cannot prove disjoint). Compiled leniently, it leaves exactly those
out (and reads ``oneOf`` as ``anyOf``): every one of them only narrows what a schema admits, so
the constraint admits a superset of the schema's values, and ``jsonschema`` then judges the
value with all of them, formats included. A value that fails raises ``SchemaError`` naming the
keyword: no path returns a value its schema refuses.

Schemas are untrusted (a server takes them from requests): their regular expressions are
matched by the ``regex`` crate (``_Regex``, linear in the text) instead of Python's
backtracking ``re``, and a schema or value too deep for Python's recursion is refused."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from typing import Any

from llamactx._llamactx import SchemaError, _Regex

__all__ = ["OutputCheck"]

#: The error ``kind`` of a finished value its schema refuses.
UNSATISFIED = "Unsatisfied"
#: Error messages quote at most this many characters of the value.
QUOTED = 200
#: jsonschema's ``unevaluatedProperties`` matches ``patternProperties`` with ``re``, which
#: ``_safe`` cannot replace: a schema with both is refused.
_UNEVALUATED_WITH_PATTERNS = ("unevaluatedProperties", "patternProperties")


class OutputCheck:
    """A JSON Schema given as text: ``constraint_text`` is what llguidance compiles (the schema,
    lenient), ``validate`` judges the finished output against the whole schema."""

    def __init__(self, schema: Any, text: str) -> None:
        # Imported on first use: with its format checkers' optional packages, jsonschema takes
        # over a second to import.
        import jsonschema  # type: ignore[import-untyped]

        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as error:
            raise _schema_error("InvalidSchema", f"not a valid JSON Schema: {error.message}") from None
        except RecursionError:
            raise _schema_error("Unsupported", "the schema is nested too deeply to check") from None
        if all(_mentions(schema, keyword) for keyword in _UNEVALUATED_WITH_PATTERNS):
            raise _schema_error("Unsupported", "unevaluatedProperties beside patternProperties cannot be checked")
        self._validator = _safe(cls)(schema, format_checker=cls.FORMAT_CHECKER)
        self.constraint_text = _lenient(schema, text)

    @classmethod
    def of(cls, text: str) -> OutputCheck | None:
        """The check of ``text``; None when it is not JSON (llguidance then says why it cannot
        compile it)."""
        try:
            schema = json.loads(text)
        except ValueError:
            return None
        return cls(schema, text)

    def validate(self, output: str) -> None:
        """Raises ``SchemaError`` (kind "Unsatisfied") naming the keyword ``output`` breaks, and
        where. The constraint ends only a complete value: an output that is not one was cut by a
        stop string, and is left as a cut by ``max_tokens`` is."""
        import jsonschema
        import referencing.exceptions

        try:
            value = json.loads(output)
        except ValueError:
            return
        except RecursionError:
            raise _schema_error("Unsupported", "the output is nested too deeply to check") from None
        try:
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        except referencing.exceptions.Unresolvable as unresolvable:
            raise _schema_error("Unsupported", f"the schema's reference cannot be resolved: {unresolvable}") from None
        except RecursionError:
            raise _schema_error("Unsupported", "the schema and output are nested too deeply to check") from None
        if error is not None:
            keyword = error.validator
            message = error.message if len(error.message) <= QUOTED else error.message[:QUOTED] + "..."
            raise _schema_error(
                UNSATISFIED, f"the output breaks the schema's {keyword!r} at {error.json_path}: {message}"
            )


def _lenient(schema: Any, text: str) -> str:
    """``schema`` for llguidance, leaving out what it cannot enforce. llguidance's own options
    (``x-guidance``) win; a boolean schema has nothing to leave out."""
    if not isinstance(schema, dict):
        return text
    options = schema.get("x-guidance", {})
    if not isinstance(options, dict):  # llguidance says what is wrong with it
        return text
    return json.dumps({**schema, "x-guidance": {"lenient": True, **options}})


def _mentions(schema: Any, keyword: str) -> bool:
    """Whether ``keyword`` is a key anywhere in ``schema``."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if keyword in node:
                return True
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return False


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> _Regex:
    try:
        return _Regex(pattern)
    except ValueError as error:
        raise _schema_error("Unsupported", str(error)) from None


def _search(pattern: str, text: str) -> bool:
    return _regex(pattern).search(text)


def _safe(cls: Any) -> Any:
    """``cls`` with the keywords that match regular expressions matching them with ``_Regex``."""
    import jsonschema

    def pattern(validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not _search(pattern, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")

    def pattern_properties(
        validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for regex, subschema in patterns.items():
            for key, value in instance.items():
                if _search(regex, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=regex)

    def additional_properties(
        validator: Any, additional: Any, instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        named, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
        extras = [key for key in instance if key not in named and not any(_search(p, key) for p in patterns)]
        if validator.is_type(additional, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], additional, path=extra)
        elif additional is False and extras:
            yield jsonschema.ValidationError(
                f"additional properties are not allowed ({', '.join(map(repr, extras))} unexpected)"
            )

    keywords = {
        "pattern": pattern,
        "patternProperties": pattern_properties,
        "additionalProperties": additional_properties,
    }
    return jsonschema.validators.extend(cls, {name: keywords[name] for name in keywords if name in cls.VALIDATORS})


def _schema_error(kind: str, message: str) -> SchemaError:
    error = SchemaError(message)
    error.kind = kind
    return error
