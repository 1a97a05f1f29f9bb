"""The build hook's clean-up of llama.cpp's CMake caches in a shared target directory."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
from support.processes import load_script

FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -mno-avx512f"


@pytest.fixture(scope="module")
def build_script() -> ModuleType:
    return load_script("llamactx_build")


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


def test_avx512_is_compiled_out_unless_asked_for(build_script: ModuleType) -> None:
    assert build_script.x86_flags({}).split() == FLAGS.split()
    assert "-mno-avx512f" not in build_script.x86_flags({"LLAMACTX_AVX512": "1"}).split()


@pytest.mark.parametrize("keep_avx512", [False, True])
def test_a_cache_of_the_other_avx512_choice_is_removed(
    build_script: ModuleType, tmp_path: Path, keep_avx512: bool
) -> None:
    environ = {"CARGO_TARGET_DIR": str(tmp_path), "LLAMACTX_AVX512": "1" if keep_avx512 else "0"}
    environ["CFLAGS"] = build_script.x86_flags(environ)
    other = {**environ, "LLAMACTX_AVX512": "0" if keep_avx512 else "1"}
    current = cmake_cache(tmp_path, "a", f"-O2 {environ['CFLAGS']} -fPIC", sys.executable)
    stale = cmake_cache(tmp_path, "b", f"-O2 {build_script.x86_flags(other)} -fPIC", sys.executable)
    build_script.forget_stale_cmake_caches(environ)
    assert [current.exists(), stale.exists()] == [True, False]


def test_bindgen_gets_the_cxx_compilers_whole_search_list(build_script: ModuleType) -> None:
    # The libclang wheel lacks clang's own headers, and a zig build turns the default list off.
    searched = [Path(folder) for folder in build_script._cxx_include_dirs({})]
    assert any((folder / "stddef.h").is_file() for folder in searched), searched
    assert any((folder / "stdio.h").is_file() for folder in searched), searched
    assert any((folder / "vector").is_file() for folder in searched), searched
