"""Copies the native module's docstrings (the Rust doc comments) into its stub, where IDEs and
type checkers read them: ``python/llamactx/_llamactx.pyi``.

    python scripts/stub_docstrings.py          # rewrite the stub
    python scripts/stub_docstrings.py --check  # fail if the stub's docstrings are stale (make lint)

Every class, method, property and function of the stub gets the docstring of the object it
describes; dunder methods are left alone. Needs the built extension (``make build``).
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from llamactx import _llamactx

STUB = Path(__file__).resolve().parent.parent / "python" / "llamactx" / "_llamactx.pyi"


def runtime_doc(owner: Any, name: str) -> str | None:
    found = inspect.getattr_static(owner, name, None)
    if isinstance(found, (classmethod, staticmethod)):
        found = found.__func__
    doc = getattr(found, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else None


WIDTH = 110


def docstring_lines(doc: str, indent: int) -> list[str]:
    pad = " " * indent
    text = doc.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = [part for line in text.splitlines() for part in textwrap.wrap(line, WIDTH - indent) or [""]]
    if len(lines) == 1:
        return [f'{pad}"""{lines[0]}"""']
    return [f'{pad}"""{lines[0]}', *[f"{pad}{line}" if line else "" for line in lines[1:]], f'{pad}"""']


def documented(node: ast.ClassDef | ast.FunctionDef) -> ast.Expr | None:
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def edits_for(
    node: ast.ClassDef | ast.FunctionDef, doc: str | None, lines: list[str]
) -> list[tuple[int, int, list[str]]]:
    """(first line, last line, replacement), 0-based and inclusive, that give `node` `doc`."""
    if doc is None:
        return []
    indent = node.col_offset + 4
    new = docstring_lines(doc, indent)
    existing = documented(node)
    if existing is not None:
        return [(existing.lineno - 1, (existing.end_lineno or existing.lineno) - 1, new)]
    only = node.body[0]
    if len(node.body) == 1 and isinstance(only, ast.Expr) and isinstance(only.value, ast.Constant):
        row = only.lineno - 1
        head = lines[row][: only.col_offset].rstrip()
        tail = lines[row][only.end_col_offset or only.col_offset :]
        return [(row, row, [head + tail.rstrip(), *new])]
    return [(node.body[0].lineno - 1, node.body[0].lineno - 2, new)]


def with_docstrings(source: str) -> str:
    tree = ast.parse(source)
    lines = source.splitlines()
    edits: list[tuple[int, int, list[str]]] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and hasattr(_llamactx, node.name):
            owner = getattr(_llamactx, node.name)
            edits += edits_for(node, runtime_doc(_llamactx, node.name), lines)
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                    edits += edits_for(item, runtime_doc(owner, item.name), lines)
        elif isinstance(node, ast.FunctionDef) and hasattr(_llamactx, node.name):
            edits += edits_for(node, runtime_doc(_llamactx, node.name), lines)
    for first, last, replacement in sorted(edits, reverse=True):
        lines[first : last + 1] = replacement
    return formatted("\n".join(lines) + "\n")


def formatted(source: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(STUB), "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def main() -> int:
    current = STUB.read_text()
    wanted = with_docstrings(current)
    if "--check" in sys.argv[1:]:
        if wanted != current:
            print(f"{STUB}: docstrings differ from the native module's; run python scripts/stub_docstrings.py")
            return 1
        return 0
    STUB.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
