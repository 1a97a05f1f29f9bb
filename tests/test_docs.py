"""The API reference names every public name of the stubs and of the package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import llamactx

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = (ROOT / "docs" / "api.md").read_text()
STUBS = ast.parse((ROOT / "python" / "llamactx" / "_llamactx.pyi").read_text())


def stub_names() -> set[str]:
    names = set()
    for node in STUBS.body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(
                item.name for item in node.body if isinstance(item, ast.FunctionDef) and not item.name.startswith("_")
            )
    return names


def test_every_stub_name_is_in_the_reference() -> None:
    missing = sorted(name for name in stub_names() if not re.search(rf"\b{name}\b", REFERENCE))
    assert not missing, missing


def test_every_exported_name_is_in_the_reference() -> None:
    missing = sorted(name for name in llamactx.__all__ if f"`{name}" not in REFERENCE)
    assert not missing, missing
