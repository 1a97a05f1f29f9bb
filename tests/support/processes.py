"""Programs the tests run in child processes (``tests/support/children/``) or load (``scripts/``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import llamactx

CHILDREN = Path(__file__).resolve().parent / "children"
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def run_child(
    model_path: Path, program: str, case: str, *, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs ``case`` of ``tests/support/children/PROGRAM.py`` on the model in a fresh interpreter, so a
    crash fails one test instead of killing pytest (see ``support/children/harness.py``)."""
    return subprocess.run(
        [sys.executable, str(CHILDREN / f"{program}.py"), str(model_path), case],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def raised_alone(model_path: Path, program: str, case: str, stdin: str | None = None, timeout: float = 120) -> str:
    """What ``case`` of ``program`` (a child of ``harness.reporting`` cases) raised, alone in a
    fresh interpreter: the name it printed after ``RAISED`` (``none`` if it returned)."""
    result = run_child(model_path, program, case, stdin=stdin, timeout=timeout)
    assert result.returncode == 0, f"child died with {result.returncode}: {result.stderr[-2000:]}"
    return result.stdout.split("RAISED ", 1)[1].strip()


def raised_one_after_another(model_path: Path, program: str, cases: list[str]) -> dict[str, str]:
    """What each of ``cases`` raised, from one child that runs them in turn (a child per case
    spent about 0.3 s starting and loading the model, most of what a case costs): empty unless
    the child ran them all and exited cleanly. A test takes its case's outcome from here when it
    is the one expected, and otherwise runs the case alone (``raised_alone``), so that a crash,
    a hang, or an earlier case's leftovers name nothing but the case that fails alone."""
    try:
        result = run_child(model_path, program, ",".join(cases), timeout=300)
    except subprocess.TimeoutExpired:
        return {}
    if result.returncode != 0:
        return {}
    outcomes: dict[str, str] = {}
    case = None
    for line in result.stdout.splitlines():
        if line.startswith("CASE "):
            case = line.removeprefix("CASE ")
        elif line.startswith("RAISED ") and case is not None:
            outcomes[case] = line.removeprefix("RAISED ").strip()
    return outcomes


def reported_cases(output: str) -> tuple[dict[str, str], list[str]]:
    """What a child running cases printed: each finished case's outcome (``RESULT NAME => OUTCOME``
    lines) and the cases it started, in order (``CASE NAME``): the last started is the one a crash
    ended (see ``support/children/corrupt_files.py``)."""
    lines = output.splitlines()
    outcomes = dict(line[7:].split(" => ", 1) for line in lines if line.startswith("RESULT "))
    return outcomes, [line[5:] for line in lines if line.startswith("CASE ")]


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def built_mtmd_cli() -> Path | None:
    """llama.cpp's ``llama-mtmd-cli``, which the extension's build compiles from the llama.cpp
    source bundled in llama-cpp-sys-4 (with the same flags, beside the library it links)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache" / "llamactx" / "target"))
    found = sorted(target.glob("llama-cmake-cache/*/build/bin/llama-mtmd-cli"), key=lambda path: path.stat().st_mtime)
    return found[-1] if found else None


def comparable_mtmd_cli() -> Path:
    """:func:`built_mtmd_cli`, for a test that compares its output with this process's.

    Skips the test where there is none, and where this process runs one of the wheel's builds:
    those are compiled by another compiler for other instruction sets, so their sums round
    differently from the CLI's and greedy choices on a random projector may part."""
    variant = llamactx.cpu_variant().name
    if variant != "source":
        pytest.skip(f"llama-mtmd-cli is the source build's; this process runs the wheel's {variant} build")
    cli = built_mtmd_cli()
    if cli is None:
        pytest.skip("llama-mtmd-cli is compiled by the extension's build from source (make build); none here")
    return cli
