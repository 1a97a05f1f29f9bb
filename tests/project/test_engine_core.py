"""The engine core is a Rust crate of its own, ``crates/llamactx-engine`` (issue 47): the
scheduler, the context it decodes in, the samplers, the model's checks and ``Error``, without
PyO3 (``tests/engine/test_engine_from_rust.py`` checks its dependency tree and runs a program on
it). The extension in ``src/`` is its Python bindings. Here: the one place the core touches
Python, ``Error``'s conversions (which Rust's orphan rule keeps beside ``Error``), is compiled
only with the core's ``python`` feature, and nothing else in the core uses PyO3 or numpy."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "crates" / "llamactx-engine"
#: What only bindings may use.
PYTHON = re.compile(r"\bpyo3\b|\bnumpy\b|\bPython<|\bPyResult\b|\bPyErr\b|\bPy<|#\[py(class|methods|function)")


def test_only_the_errors_python_feature_touches_python() -> None:
    sources = sorted((CORE / "src").rglob("*.rs")) + sorted((CORE / "examples").rglob("*.rs"))
    assert len(sources) > 50
    with_python = [path.relative_to(CORE) for path in sources if PYTHON.search(path.read_text())]
    assert with_python == [Path("src/errors/python.rs")]
    errors = (CORE / "src" / "errors.rs").read_text()
    assert '#[cfg(feature = "python")]\npub mod python;' in errors
    manifest = (CORE / "Cargo.toml").read_text()
    assert re.search(r"^pyo3 = \{[^}]*optional = true", manifest, re.MULTILINE)
    assert 'python = ["dep:pyo3"]' in manifest


def test_the_bindings_live_in_the_extension() -> None:
    """Every Python class is defined in ``src/``; the core defines none."""
    defined = {
        path.relative_to(ROOT) for path in (ROOT / "src").rglob("*.rs") if re.search(r"#\[pyclass", path.read_text())
    }
    assert len(defined) > 15
    assert not [path for path in (CORE / "src").rglob("*.rs") if "#[pyclass" in path.read_text()]
