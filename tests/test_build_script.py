"""The build hook's clean-up of llama.cpp's CMake caches in a shared target directory."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "llamactx_build.py"
FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


@pytest.fixture(scope="module")
def build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llamactx_build", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cmake_cache(target: Path, name: str, flags: str, command: str) -> Path:
    cache = target / "llama-cmake-cache" / name / "build" / "CMakeCache.txt"
    cache.parent.mkdir(parents=True)
    cache.write_text(f"CMAKE_C_FLAGS:STRING={flags}\nCMAKE_COMMAND:INTERNAL={command}\n")
    return cache


def test_caches_of_other_flags_or_of_a_vanished_cmake_are_removed(build_script: ModuleType, tmp_path: Path) -> None:
    reusable = cmake_cache(tmp_path, "a", FLAGS, sys.executable)  # any file that exists
    other_flags = cmake_cache(tmp_path, "b", "-O2", sys.executable)
    vanished = cmake_cache(tmp_path, "c", FLAGS, str(tmp_path / "deleted-checkout" / ".venv" / "bin" / "cmake"))
    build_script.forget_stale_cmake_caches({"CARGO_TARGET_DIR": str(tmp_path), "CFLAGS": FLAGS})
    assert [reusable.exists(), other_flags.exists(), vanished.exists()] == [True, False, False]


def test_without_c_flags_only_a_vanished_cmake_counts(build_script: ModuleType, tmp_path: Path) -> None:
    kept = cmake_cache(tmp_path, "a", "-O2", sys.executable)
    vanished = cmake_cache(tmp_path, "b", "-O2", str(tmp_path / "gone" / "cmake"))
    build_script.forget_stale_cmake_caches({"CARGO_TARGET_DIR": str(tmp_path)})
    assert [kept.exists(), vanished.exists()] == [True, False]
