"""The native toolchain for building llamactx, taken from PyPI instead of the system.

Building llama.cpp through llama-cpp-sys-4 needs libclang (for bindgen) and CMake. Both come
as PyPI wheels (``libclang``, ``cmake``), so a machine with Rust, Python and a C/C++ compiler
needs no root and no system packages. This module points the build at them:

- as the PEP 517 backend named in pyproject.toml: maturin's hooks, run with that environment
  (``pip install .``, ``pip wheel .``, builds from the sdist);
- as a command, ``python scripts/llamactx_build.py COMMAND [ARGS...]``: runs COMMAND (cargo,
  maturin) with that environment; the Makefile runs every build through it.

Settings already made by the user (``LIBCLANG_PATH``, ``CMAKE``) win; without the wheels the
system's libclang and cmake are used, as bindgen and cmake-rs find them.

On x86-64 it also compiles two instruction sets out of llama.cpp (in CFLAGS/CXXFLAGS):

- AMX (``-mno-amx-*``): the pinned llama.cpp runs AMX tile instructions on threads that Linux has
  not granted AMX to, which kills the process with SIGILL on the first decode wherever
  ``-march=native`` finds AMX (seen on a Sapphire Rapids VM; upstream llama.cpp pull request
  26954 is the fix);
- AVX-512 (``-mno-avx512f``, which takes its extensions with it), leaving AVX2: with
  AVX512-FP16, ggml's f16 vector loops step over 128 values, so flash attention over heads of 64
  runs scalar code (one-token decodes about 25% slower); without it AVX-512 measured no faster
  than AVX2 (README, "Build choices"). ``LLAMACTX_AVX512=1`` keeps AVX-512.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def toolchain_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to ``environ`` so that the build uses the PyPI toolchain."""
    added: dict[str, str] = {}
    if "LIBCLANG_PATH" not in environ:
        libclang_dir = _wheel_libclang_dir()
        if libclang_dir is not None:
            added["LIBCLANG_PATH"] = str(libclang_dir)
            # The wheel has libclang without clang's own headers (stddef.h, stdbool.h, ...):
            # the C++ compiler's serve bindgen equally well. All of its search list is named,
            # because a zig build (the portable wheel) turns the default one off.
            includes = _cxx_include_dirs(environ)
            if includes:
                extra = environ.get("BINDGEN_EXTRA_CLANG_ARGS", "")
                named = shlex.join(arg for include in includes for arg in ("-isystem", include))
                added["BINDGEN_EXTRA_CLANG_ARGS"] = f"{extra} {named}".strip()
    if "CMAKE" not in environ:
        cmake = _wheel_cmake()
        if cmake is not None:
            added["CMAKE"] = str(cmake)
    flags = x86_flags(environ)
    if platform.machine().lower() in ("x86_64", "amd64") and _compiler_accepts(environ, flags):
        for variable in ("CFLAGS", "CXXFLAGS"):
            added[variable] = f"{environ.get(variable, '')} {flags}".strip()
    return added


def x86_flags(environ: Mapping[str, str]) -> str:
    """The instruction sets compiled out on x86-64 (see the module's docstring)."""
    return NO_AMX if environ.get("LLAMACTX_AVX512") == "1" else f"{NO_AMX} {NO_AVX512}"


def forget_stale_cmake_caches(environ: Mapping[str, str]) -> None:
    """Removes the CMake caches of llama.cpp builds that cannot be reused: configured without
    today's C flags, or by a cmake that is gone.

    llama-cpp-sys-4 keeps one CMake build directory per feature set in the target directory
    and never configures it again, so a build made before the flags changed (e.g. with the AMX
    kernels) would go on being linked. A build directory also runs the cmake that configured it,
    by its path: one from the venv of a deleted checkout that shared the target directory fails
    every later build ("Error 127"). Without its CMakeCache.txt, CMake configures afresh.
    """
    flags = environ.get("CFLAGS", "")
    target = Path(environ.get("CARGO_TARGET_DIR") or "target")
    for cache in target.glob("llama-cmake-cache/*/build/CMakeCache.txt"):
        lines = cache.read_text(errors="replace").splitlines()
        configured = next((line for line in lines if line.startswith("CMAKE_C_FLAGS:")), "")
        command = next((line for line in lines if line.startswith("CMAKE_COMMAND:")), "").partition("=")[2]
        if not _configured_with(configured, flags) or (command and not Path(command).is_file()):
            cache.unlink()


def _configured_with(configured: str, flags: str) -> bool:
    """Whether a cache's C flags hold ``flags``, and none of the flags this script adds that
    ``flags`` lacks (a build with AVX-512 is stale once it is compiled out, and the reverse)."""
    options = set(configured.partition("=")[2].split())
    wanted = set(flags.split())
    return wanted <= options and not (_ADDED_FLAGS - wanted) & options


NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
NO_AVX512 = "-mno-avx512f"
_ADDED_FLAGS = frozenset(f"{NO_AMX} {NO_AVX512}".split())


def _wheel_libclang_dir() -> Path | None:
    try:
        import clang  # the `libclang` wheel's package
    except ImportError:
        return None
    native = Path(clang.__file__).parent / "native"
    return native if any(native.glob("libclang*.so*")) else None


def _wheel_cmake() -> Path | None:
    try:
        import cmake
    except ImportError:
        return None
    found = shutil.which("cmake", path=str(cmake.CMAKE_BIN_DIR))
    return Path(found) if found else None


def _compiler(environ: Mapping[str, str]) -> str | None:
    return environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _run_compiler(environ: Mapping[str, str], *args: str) -> str | None:
    """The compiler's output for ``args``, or None when there is none or it fails."""
    compiler = _compiler(environ)
    if not compiler:
        return None
    try:
        return subprocess.run([compiler, *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def _cxx_include_dirs(environ: Mapping[str, str]) -> list[str]:
    """The C++ compiler's system header search list, in its order (empty without a compiler)."""
    compiler = environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        return []
    try:
        listing = subprocess.run(
            [compiler, "-E", "-x", "c++", "-v", os.devnull], capture_output=True, text=True, check=True
        ).stderr
    except (OSError, subprocess.CalledProcessError):
        return []
    searched = listing.partition("#include <...> search starts here:")[2].partition("End of search list.")[0]
    return [line.strip() for line in searched.splitlines() if os.path.isdir(line.strip())]


def _compiler_accepts(environ: Mapping[str, str], flags: str) -> bool:
    return _run_compiler(environ, *flags.split(), "-E", "-x", "c", os.devnull) is not None


def _with_toolchain(hook: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        os.environ.update(toolchain_env(os.environ))
        forget_stale_cmake_caches(os.environ)
        return hook(*args, **kwargs)

    run.__name__ = hook.__name__
    run.__doc__ = hook.__doc__
    return run


_MATURIN_HOOKS = frozenset(
    {
        "build_wheel",
        "build_sdist",
        "build_editable",
        "get_requires_for_build_wheel",
        "get_requires_for_build_sdist",
        "get_requires_for_build_editable",
        "prepare_metadata_for_build_wheel",
        "prepare_metadata_for_build_editable",
    }
)


def __getattr__(name: str) -> Any:
    # Resolved on first use, so that importing this module (a test does) needs no maturin.
    if name in _MATURIN_HOOKS:
        import maturin

        if hasattr(maturin, name):
            return _with_toolchain(getattr(maturin, name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python scripts/llamactx_build.py COMMAND [ARGS...]")
    environment = {**os.environ, **toolchain_env(os.environ)}
    forget_stale_cmake_caches(environment)
    os.execvpe(sys.argv[1], sys.argv[1:], environment)
