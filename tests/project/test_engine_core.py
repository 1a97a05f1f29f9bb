"""The engine core is plain Rust (issue 47): the modules the engine reaches, from its scheduler
to the context it decodes in, use no PyO3 and no numpy, and reach the Python classes only
through the ``python`` modules beside them (``errors/python.rs``, ``engine/python.rs``, ...),
which they declare but never use. Read from the sources, as ``use crate::...`` paths: a core
module that starts to use a binding fails here, before the crate is split in two."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
#: Where the engine's modules start: the scheduler, the backend on llama.cpp, the engine itself.
ROOTS = ("crate::engine", "crate::engine::scheduler", "crate::engine::llama_backend")
#: What only bindings may use.
PYTHON = re.compile(r"\bpyo3\b|\bnumpy\b|\bPython<|\bPyResult\b|\bPyErr\b|\bPy<|#\[py(class|methods|function)")
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)(?:::\{([^}]*)\})?")


def module_names() -> dict[str, Path]:
    modules = {}
    for path in SRC.rglob("*.rs"):
        parts = path.relative_to(SRC).with_suffix("").parts
        modules["crate" if parts == ("lib",) else "::".join(("crate", *parts))] = path
    return modules


def without_tests(source: str) -> str:
    """The source up to its unit tests (they may use what the module itself does not)."""
    return re.split(r"#\[cfg\(test\)\]\s*mod tests", source)[0]


def resolve(modules: dict[str, Path], here: str, head: str, rest: str) -> str | None:
    """The longest module that ``head::rest`` names, seen from module ``here``."""
    segments = [segment for segment in rest.split("::") if segment]
    base = ["crate"] if head == "crate" else here.split("::")
    if head == "super":
        base = base[:-1]
    while segments and segments[0] == "super":
        base, segments = base[:-1], segments[1:]
    found = None
    for end in range(len(segments) + 1):
        candidate = "::".join(base + segments[:end])
        if candidate in modules:
            found = candidate
    return found


def used_modules(modules: dict[str, Path], name: str) -> set[str]:
    used = set()
    for match in PATH.finditer(without_tests(modules[name].read_text())):
        head, rest, group = match.groups()
        targets = [rest] + [
            f"{rest}::{item.split('::')[0].strip()}" for item in (group or "").split(",") if item.strip()
        ]
        for target in targets:
            module = resolve(modules, name, head, target)
            if module and module not in (name, "crate"):
                used.add(module)
    return used


def is_binding(name: str) -> bool:
    return "python" in name.split("::")


def core_modules() -> dict[str, Path]:
    """The roots, what they use, and so on; with each module its submodules but the bindings:
    a type's methods live in submodules that nothing names in a path (``open_context/kv.rs``)."""
    modules = module_names()
    seen: set[str] = set()
    stack = list(ROOTS)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(used_modules(modules, name))
            stack.extend(child for child in modules if child.startswith(f"{name}::") and not is_binding(child))
    return {name: modules[name] for name in seen}


def test_the_engine_core_uses_no_python() -> None:
    core = core_modules()
    # The engine reaches the context, the samplers, the model's checks and the errors.
    for expected in ("crate::open_context::kv", "crate::sampler::params", "crate::model", "crate::errors"):
        assert expected in core, f"{expected} is not reached: the walk of the sources is broken"
    assert len(core) >= 30
    bindings = sorted(name for name in core if is_binding(name))
    assert not bindings, f"core modules use the Python bindings {bindings}"
    with_python = sorted(
        f"{name} ({path.relative_to(SRC.parent)})"
        for name, path in core.items()
        if PYTHON.search(without_tests(path.read_text()))
    )
    assert not with_python, f"core modules that use PyO3 or numpy: {with_python}"


def test_a_core_module_that_used_a_binding_would_be_found() -> None:
    """The walk follows ``use`` paths, grouped imports and ``super``: a binding reached through
    any of them is seen (here, the bindings' own modules, which use PyO3)."""
    modules = module_names()
    loop = used_modules(modules, "crate::engine::python::context_loop")
    assert {"crate::engine::python::speculative_options", "crate::engine::request::python"} <= loop
    assert "crate::context" in used_modules(modules, "crate::context::kv")
    assert PYTHON.search(modules["crate::engine::python"].read_text())
