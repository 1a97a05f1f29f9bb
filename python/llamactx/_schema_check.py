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
backtracking ``re``, a schema or value too deep for Python's recursion is refused, a reference
can only lead inside the schema's own document (nothing is ever fetched: jsonschema's default
registry GETs any URL a ``$ref`` or ``$dynamicRef`` names), and one check applies at most
``MAX_CHECK_STEPS`` keywords (``oneOf``/``anyOf`` try every branch at every level, so their
nesting costs exponential time)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any
from urllib.parse import urldefrag, urljoin

from llamactx._llamactx import SchemaError, _check_constraint_size, _Regex

__all__ = ["OutputCheck"]

#: The error ``kind`` of a finished value its schema refuses.
UNSATISFIED = "Unsatisfied"
#: Error messages quote at most this many characters of the value.
QUOTED = 200
#: jsonschema's ``unevaluatedProperties`` matches ``patternProperties`` with ``re``, which
#: ``_safe`` cannot replace: a schema with both is refused.
_UNEVALUATED_WITH_PATTERNS = ("unevaluatedProperties", "patternProperties")
#: The most keywords one check of a finished value applies. Ordinary schemas and values take
#: hundreds; 24 nested ``oneOf: [A, A]`` (5 KB) take 2**24 and froze a server for over 15 s.
#: Measured here: about 80,000 steps a second, so a check stops within about 1.3 s.
MAX_CHECK_STEPS = 100_000
#: The keywords that name another schema by URI.
_REFERENCE_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


class OutputCheck:
    """A JSON Schema given as text: ``constraint_text`` is what llguidance compiles (the schema,
    lenient), ``validate`` judges the finished output against the whole schema."""

    def __init__(self, schema: Any, text: str) -> None:
        # Imported on first use: with its format checkers' optional packages, jsonschema takes
        # over a second to import.
        import jsonschema  # type: ignore[import-untyped]
        import referencing

        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as error:
            raise _schema_error("InvalidSchema", f"not a valid JSON Schema: {error.message}") from None
        except RecursionError:
            raise _schema_error("Unsupported", "the schema is nested too deeply to check") from None
        if all(_mentions(schema, keyword) for keyword in _UNEVALUATED_WITH_PATTERNS):
            raise _schema_error("Unsupported", "unevaluatedProperties beside patternProperties cannot be checked")
        if (outside := _reference_outside(schema)) is not None:
            raise _schema_error(
                "Unsupported", f"the reference {outside[:QUOTED]!r} leads outside the schema, and nothing is fetched"
            )
        # An empty registry retrieves nothing: jsonschema's default one fetches any URL.
        self._validator = _safe(cls)(schema, format_checker=cls.FORMAT_CHECKER, registry=referencing.Registry())
        self.constraint_text = _lenient(schema, text)

    @classmethod
    def of(cls, text: str) -> OutputCheck | None:
        """The check of ``text``; None when it is not JSON (llguidance then says why it cannot
        compile it). ``SchemaError`` (kind ``TooLarge``) first, in one pass over the text, for a
        schema llguidance would refuse to compile as too large: checking it as a JSON Schema
        costs far more (27 s for 20,001 chained ``$defs``)."""
        _check_constraint_size("json_schema", text)
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
        steps = _STEPS_LEFT.set([MAX_CHECK_STEPS])
        try:
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        except referencing.exceptions.Unresolvable as unresolvable:
            raise _schema_error("Unsupported", f"the schema's reference cannot be resolved: {unresolvable}") from None
        except RecursionError:
            raise _schema_error("Unsupported", "the schema and output are nested too deeply to check") from None
        finally:
            _STEPS_LEFT.reset(steps)
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


def _reference_outside(schema: Any) -> str | None:
    """The first reference in ``schema`` whose document is neither the schema's nor one it
    embeds (an ``$id`` inside it), or None. Relative references resolve against the ``$id``s
    around them, as jsonschema resolves them."""
    documents: set[str] = set()
    references: list[tuple[str, str]] = []
    pending: list[tuple[Any, str]] = [(schema, "")]
    while pending:
        node, base = pending.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$id"), str):
                base = urldefrag(urljoin(base, node["$id"]))[0]
                documents.add(base)
            references.extend((base, node[key]) for key in _REFERENCE_KEYWORDS if isinstance(node.get(key), str))
            pending.extend((value, base) for value in node.values())
        elif isinstance(node, list):
            pending.extend((value, base) for value in node)
    documents.add("")
    for base, reference in references:
        if urldefrag(urljoin(base, reference))[0] not in documents:
            return reference
    return None


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


#: The keywords the check running on this thread (or task) may still apply, in a box.
_STEPS_LEFT: ContextVar[list[int]] = ContextVar("_STEPS_LEFT")


def _counted(keyword: Callable[..., Any]) -> Callable[..., Iterator[Any]]:
    """``keyword`` (a jsonschema keyword function), spending one of the check's steps each time
    it applies."""

    def apply(validator: Any, value: Any, instance: Any, schema: Mapping[str, Any]) -> Iterator[Any]:
        left = _STEPS_LEFT.get([MAX_CHECK_STEPS])
        if left[0] <= 0:
            raise _schema_error(
                "TooLarge", f"checking the output against this schema takes more than {MAX_CHECK_STEPS} steps"
            )
        left[0] -= 1
        yield from keyword(validator, value, instance, schema) or ()

    return apply


def _safe(cls: Any) -> Any:
    """``cls`` with the keywords that match regular expressions matching them with ``_Regex``,
    and every keyword counted against the check's steps (``_counted``)."""
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
        **cls.VALIDATORS,
        "pattern": pattern,
        "patternProperties": pattern_properties,
        "additionalProperties": additional_properties,
    }
    return jsonschema.validators.extend(
        cls, {name: _counted(keywords[name]) for name in keywords if name in cls.VALIDATORS}
    )


def _schema_error(kind: str, message: str) -> SchemaError:
    error = SchemaError(message)
    error.kind = kind
    return error
