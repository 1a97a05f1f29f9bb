"""Lists that live in more than one place agree with their one source: the exception classes
and the context options (declared once in Rust), and the marks of copied llama.cpp internals
(listed in docs/llama-internals.md)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import llamactx
from llamactx import _llamactx

ROOT = Path(__file__).resolve().parents[2]
STUB = ast.parse((ROOT / "python" / "llamactx" / "_llamactx.pyi").read_text())
REFERENCE = (ROOT / "docs" / "api.md").read_text()


def native_exception_names() -> set[str]:
    return {
        name
        for name, value in vars(_llamactx).items()
        if isinstance(value, type) and issubclass(value, llamactx.LlamaCppError)
    }


def stub_class(name: str) -> ast.ClassDef:
    return next(node for node in STUB.body if isinstance(node, ast.ClassDef) and node.name == name)


def test_the_exception_classes_are_the_same_everywhere() -> None:
    native = native_exception_names()
    assert len(native) > 20
    stubbed = {
        node.name
        for node in STUB.body
        if isinstance(node, ast.ClassDef) and node.bases and ast.unparse(node.bases[0]).endswith("Error")
    }
    stubbed |= {"LlamaCppError"}
    exported = {name for name in llamactx.__all__ if name in native or name.endswith("Error")}
    documented = {name for name in native if re.search(rf"`{name}[`(]", REFERENCE)}
    assert stubbed == native
    assert exported == native
    assert documented == native


def context_option_names() -> list[str]:
    """The names `new_context` takes, as its error for an unknown keyword lists them."""
    model = llamactx.LlamaModel.load_from_file(llamactx.default_model_path(), vocab_only=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'") as raised:
        model.new_context(bogus=1)
    return str(raised.value).split("it takes ", 1)[1].split(", ")


def test_the_context_options_are_the_same_everywhere() -> None:
    native = context_option_names()
    new_context = next(
        item
        for item in stub_class("LlamaModel").body
        if isinstance(item, ast.FunctionDef) and item.name == "new_context"
    )
    assert [argument.arg for argument in new_context.args.kwonlyargs] == native
    reference_line = next(line for line in REFERENCE.splitlines() if line.startswith("- `model.new_context("))
    assert re.findall(r"(\w+)(?:,|\))", reference_line.split("`")[1].split("(", 1)[1]) == native


def test_a_context_option_of_the_wrong_type_names_the_argument(model: llamactx.LlamaModel) -> None:
    with pytest.raises(TypeError, match="argument 'n_ctx'"):
        model.new_context(n_ctx="big")
    with pytest.raises(OverflowError, match="argument 'n_batch'"):
        model.new_context(n_batch=-1)


def test_the_marked_llama_cpp_internals_are_the_listed_ones() -> None:
    listed = set(
        re.findall(
            r"^\| `((?:crates/[\w-]+/)?src/[\w/]+\.rs)` \|", (ROOT / "docs" / "llama-internals.md").read_text(), re.M
        )
    )
    marked = {
        str(path.relative_to(ROOT))
        for path in [*(ROOT / "src").rglob("*.rs"), *(ROOT / "crates").rglob("*.rs")]
        if "[llama.cpp internal]" in path.read_text()
    }
    assert listed == marked


def stub_definitions() -> list[tuple[str, ast.ClassDef | ast.FunctionDef, object]]:
    """Every public class, method and function of the stub, with the object it describes."""
    found: list[tuple[str, ast.ClassDef | ast.FunctionDef, object]] = []
    for node in STUB.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and hasattr(_llamactx, node.name):
            owner = getattr(_llamactx, node.name)
            found.append((node.name, node, owner))
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                        member = inspect.getattr_static(owner, item.name)
                        found.append((f"{node.name}.{item.name}", item, member))
    return found


def words(text: str | None) -> list[str]:
    return (text or "").split()


def test_every_stub_definition_carries_the_native_docstring() -> None:
    definitions = stub_definitions()
    assert len(definitions) > 150
    undocumented = [name for name, node, _ in definitions if not ast.get_docstring(node)]
    assert not undocumented, undocumented
    stale = [
        name
        for name, node, native in definitions
        if words(ast.get_docstring(node)) != words(getattr(getattr(native, "__func__", native), "__doc__", None))
    ]
    assert not stale, f"{stale}: run python scripts/stub_docstrings.py"


def test_the_guard_ledger_names_real_cases() -> None:
    ledger = (ROOT / "docs" / "guards.md").read_text()
    programs = {
        "misuse_raises": "misuse_raises.py",
        "misuse_works_or_raises": "misuse_works_or_raises.py",
        "hostile": "hostile_inputs.py",
    }
    named = re.findall(r"`(misuse_works_or_raises|misuse_raises|hostile)::(\w+)`", ledger)
    assert len(named) > 20
    missing = [
        f"{program}::{name}"
        for program, name in named
        if f"def {name}(" not in (ROOT / "tests" / "support" / "children" / programs[program]).read_text()
    ]
    assert not missing, missing
