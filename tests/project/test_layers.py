"""The Python layer imports only downward: no cycle among llamactx's modules, and no module
imports another of them inside a function to get around one (issue 29). The optional extras
(``llamactx.server``, ``llamactx.ray``) are imported lazily where a command needs them."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "llamactx"
#: Imported on first use, so that the core package works without the extras installed.
OPTIONAL = ("llamactx.server", "llamactx.ray")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module] if node.module else []


def llamactx_imports(path: Path) -> tuple[set[str], list[str]]:
    """The llamactx modules ``path`` imports at its top level, and those it imports elsewhere
    (inside functions or ``TYPE_CHECKING`` blocks)."""
    tree = ast.parse(path.read_text())
    top = {
        name
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in imported(node)
        if name.startswith("llamactx")
    }
    nested = [
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom) and node not in tree.body
        for name in imported(node)
        if name.startswith("llamactx") and not name.startswith(OPTIONAL)
    ]
    return top, nested


def test_the_python_layer_imports_only_downward() -> None:
    graph: dict[str, set[str]] = {}
    hidden: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        top, nested = llamactx_imports(path)
        graph[name] = {other for other in top if other != name and not other.startswith(f"{name}.")}
        if nested:
            hidden[name] = nested
    assert len(graph) > 15
    assert not hidden, f"imports inside functions or TYPE_CHECKING blocks: {hidden}"
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as cycle:
        raise AssertionError(f"an import cycle: {cycle.args[1]}") from None
    # The leaves come first: the native module and the constraints under everything that generates.
    assert order.index("llamactx._constraints") < order.index("llamactx._generation") < order.index("llamactx._chat")
    assert order.index("llamactx._chat") < order.index("llamactx._engine") < order.index("llamactx._structured")
