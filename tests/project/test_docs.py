"""The API reference names every public name of the stubs and of the package, every public
name has a docstring, and every dotted name the documents mention resolves."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

import llamactx
import llamactx.bench
import llamactx.cli
import llamactx.ray
import llamactx.server

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = (ROOT / "docs" / "api.md").read_text()
STUBS = ast.parse((ROOT / "python" / "llamactx" / "_llamactx.pyi").read_text())
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PUBLIC_SUBMODULES = [llamactx.bench, llamactx.cli, llamactx.ray, llamactx.server]


def stub_names() -> set[str]:
    names = set()
    for node in STUBS.body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(
                item.name for item in node.body if isinstance(item, ast.FunctionDef) and not item.name.startswith("_")
            )
    return names


def dotted_names() -> set[str]:
    """Every ``llamactx.a.b...`` written in the README and the docs."""
    pattern = re.compile(r"(?<![\w/.-])llamactx(?:\.[A-Za-z_]\w*)+")
    return {name for document in DOCUMENTS for name in pattern.findall(document.read_text())}


def resolve(dotted: str) -> object:
    """What ``dotted`` names, looked up as Python does after ``import`` of it: attribute by
    attribute, importing a submodule where no attribute has the name."""
    parts = dotted.split(".")
    found: object = importlib.import_module(parts[0])
    for depth, part in enumerate(parts[1:], start=2):
        if hasattr(found, part):
            found = getattr(found, part)
        elif inspect.ismodule(found):
            found = importlib.import_module(".".join(parts[:depth]))
        else:
            raise AttributeError(f"{'.'.join(parts[: depth - 1])} has no attribute {part!r}")
    return found


def test_every_stub_name_is_in_the_reference() -> None:
    missing = sorted(name for name in stub_names() if not re.search(rf"\b{name}\b", REFERENCE))
    assert not missing, missing


def test_every_exported_name_is_in_the_reference() -> None:
    missing = sorted(name for name in llamactx.__all__ if f"`{name}" not in REFERENCE)
    missing += [
        f"{module.__name__}.{name}"
        for module in PUBLIC_SUBMODULES
        for name in module.__all__
        if f"{module.__name__}.{name}" not in REFERENCE
    ]
    assert not missing, missing


def test_every_public_name_has_a_docstring() -> None:
    public = [(f"llamactx.{name}", getattr(llamactx, name)) for name in llamactx.__all__ if name != "__version__"]
    public += [(f"{m.__name__}.{name}", getattr(m, name)) for m in PUBLIC_SUBMODULES for name in m.__all__]
    public += [(m.__name__, m) for m in (llamactx, *PUBLIC_SUBMODULES)]
    missing = [name for name, value in public if not (value.__doc__ or "").strip()]
    assert not missing, missing


@pytest.mark.parametrize("dotted", sorted(dotted_names()))
def test_documented_dotted_name_resolves(dotted: str) -> None:
    resolve(dotted)


def test_the_documents_mention_the_dotted_names_they_should() -> None:
    found = dotted_names()
    assert {"llamactx.LlamaModel.load_from_file", "llamactx.bench.speeds", "llamactx.cli.main"} <= found


def test_resolve_fails_for_a_function_used_as_a_module() -> None:
    # The mistake this file guards against: `generate` is a function, not a module.
    with pytest.raises(AttributeError):
        resolve("llamactx.generate.prefill")
