"""The engine core is a Rust crate of its own, ``crates/llamactx-engine`` (issue 47): the
scheduler, the context it decodes in, the samplers, the model's checks and ``Error``, without
PyO3 (``tests/engine/test_engine_from_rust.py`` checks its dependency tree and runs a program on
it). The extension in ``src/`` is its Python bindings. Here: nothing in the core uses PyO3 or
numpy, not even ``Error``'s conversion to Python exceptions (functions in the extension's
``src/errors/python.rs``, since Rust's orphan rule allows a ``From`` only beside ``Error``), so
the extension and the core's example share one build of the core."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "crates" / "llamactx-engine"
#: What only bindings may use.
PYTHON = re.compile(r"\bpyo3\b|\bnumpy\b|\bPython<|\bPyResult\b|\bPyErr\b|\bPy<|#\[py(class|methods|function)")


def test_nothing_in_the_core_touches_python() -> None:
    sources = sorted((CORE / "src").rglob("*.rs")) + sorted((CORE / "examples").rglob("*.rs"))
    assert len(sources) > 50
    assert [path.relative_to(CORE) for path in sources if PYTHON.search(path.read_text())] == []
    assert not re.search(r"^(pyo3|numpy)\b", (CORE / "Cargo.toml").read_text(), re.MULTILINE)
    assert "pub fn to_py(err: Error) -> PyErr" in (ROOT / "src" / "errors" / "python.rs").read_text()


def test_the_extension_builds_the_core_with_the_examples_features() -> None:
    """The extension's default build turns on the core's default features, which a Rust program
    of the core gets: one build of the core serves both, as the example's test builds it (with the
    extension's package selected, so that cargo resolves the dependencies' features alike; a
    second build took a minute of a test worker's CPU)."""
    manifest = (ROOT / "Cargo.toml").read_text()
    assert re.search(r"^llamactx-engine = \{[^}]*default-features = false \}", manifest, re.MULTILINE)
    assert re.search(r'^native = \[[^]]*"llamactx-engine/default"', manifest, re.MULTILINE)


def test_the_bindings_live_in_the_extension() -> None:
    """Every Python class is defined in ``src/``; the core defines none."""
    defined = {
        path.relative_to(ROOT) for path in (ROOT / "src").rglob("*.rs") if re.search(r"#\[pyclass", path.read_text())
    }
    assert len(defined) > 15
    assert not [path for path in (CORE / "src").rglob("*.rs") if "#[pyclass" in path.read_text()]
