"""Which build of the compiled extension this process runs, and why.

The x86-64 Linux wheel carries one build of ``llamactx._llamactx`` per CPU level, in
``llamactx/_cpu_builds/`` (``scripts/portable_wheel.py`` makes them): llama.cpp's kernels are
compiled for each level, so one wheel runs on every x86-64-v2 CPU and at full speed on newer
ones. ``load_extension`` opens the baseline build, which runs wherever the wheel does, as a plain
shared library and asks it what the CPU and its OS support (CPUID, and XGETBV for AVX state);
then it imports the best build those allow as ``llamactx._llamactx``. A source build has no such
folder: its one build is imported as usual.

Only levels whose kernels measured fastest are built: AVX-512 is left out, as in source builds
(README, "Build choices"), and so are the AMX kernels that die with SIGILL where the kernel has
not granted AMX.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: Forces a build by name (e.g. to compare builds); refused if the CPU cannot run it.
FORCE_VARIABLE = "LLAMACTX_CPU_BUILD"
BUILDS_FOLDER = "_cpu_builds"
EXTENSION = "llamactx._llamactx"

_X86_64_V2 = frozenset({"sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cmpxchg16b"})
_X86_64_V3 = _X86_64_V2 | {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe", "xsave"}


@dataclass(frozen=True)
class CpuBuild:
    """One build of the extension in the x86-64 wheel."""

    name: str
    #: The C flags llama.cpp is compiled with, as ``zig cc`` takes them.
    cflags: str
    #: The CPU features (``is_x86_feature_detected!`` names) its code may use.
    needs: frozenset[str]
    #: Which CPUs it is for, in words.
    description: str


#: Best first; the last one is the baseline that every supported CPU runs.
BUILDS = (
    CpuBuild(
        "x86-64-v3-avxvnni",
        "-march=x86_64_v3 -mavxvnni",
        _X86_64_V3 | {"avxvnni"},
        "x86-64-v3 with AVX-VNNI: Intel Alder Lake, Sapphire Rapids and later",
    ),
    CpuBuild("x86-64-v3", "-march=x86_64_v3", _X86_64_V3, "AVX2, FMA, F16C, BMI2: Intel Haswell, AMD Zen and later"),
    CpuBuild("x86-64-v2", "-march=x86_64_v2", _X86_64_V2, "SSE4.2 and POPCNT, no AVX: Intel Nehalem and later"),
)
BASELINE = BUILDS[-1]


@dataclass(frozen=True)
class CpuVariant:
    """Which build of llama.cpp's CPU kernels this process runs, and why (see :func:`cpu_variant`).

    ``name`` is a build of the wheel (``"x86-64-v3"``, ...) or ``"source"`` for an extension
    compiled on this machine; ``features`` are the CPU features, detected at import, that the
    builds differ in.
    """

    name: str
    reason: str
    features: tuple[str, ...]


def choose(features: frozenset[str], available: frozenset[str], forced: str | None = None) -> tuple[CpuBuild, str]:
    """The build to load for a CPU with ``features``, among the ``available`` names, and why.

    Raises ImportError when no available build can run here, or ``forced`` names one that cannot.
    """
    if forced is not None:
        build = next((build for build in BUILDS if build.name == forced and build.name in available), None)
        if build is None:
            names = ", ".join(sorted(available))
            raise ImportError(f"{FORCE_VARIABLE}={forced} names no build of this wheel (it has {names})")
        missing = build.needs - features
        if missing:
            raise ImportError(f"{FORCE_VARIABLE}={forced}: this CPU lacks {', '.join(sorted(missing))}")
        return build, f"chosen by {FORCE_VARIABLE}={forced}"
    runnable = [build for build in BUILDS if build.name in available and build.needs <= features]
    if not runnable:
        lacking = ", ".join(sorted(BASELINE.needs - features))
        raise ImportError(f"llamactx needs an x86-64-v2 CPU ({BASELINE.description}); this one lacks {lacking}")
    build = runnable[0]
    better = [other for other in BUILDS[: BUILDS.index(build)] if other.name in available]
    reason = f"the CPU and OS support all it uses ({build.description})"
    if better:
        reason += f"; {better[-1].name} would need {', '.join(sorted(better[-1].needs - features))}"
    if "avx512f" in features:
        reason += "; AVX-512 is not used: its kernels measured no faster than AVX2's (README, Build choices)"
    return build, reason


def load_extension() -> CpuVariant:
    """Imports ``llamactx._llamactx``, the build for this CPU where the install has several.

    Runs once, from ``llamactx/__init__.py`` before any module that uses the extension.
    """
    global _loaded
    if _loaded is None:
        folder = Path(__file__).with_name(BUILDS_FOLDER)
        _loaded = _load_best_build(folder) if folder.is_dir() else _load_source_build()
    return _loaded


def cpu_variant() -> CpuVariant:
    """Which build of llama.cpp's CPU kernels this process runs, and why it was chosen.

    The wheel for x86-64 Linux holds several builds (``x86-64-v2``, ``x86-64-v3``,
    ``x86-64-v3-avxvnni``) and imports the best one this CPU and its OS can run; the environment
    variable ``LLAMACTX_CPU_BUILD`` forces one. A build from source reports ``"source"``.
    """
    return load_extension()


_loaded: CpuVariant | None = None


def _build_path(folder: Path, name: str) -> Path:
    return folder / f"{name}.abi3.so"


def _load_best_build(folder: Path) -> CpuVariant:
    available = frozenset(build.name for build in BUILDS if _build_path(folder, build.name).is_file())
    if BASELINE.name not in available:
        raise ImportError(f"llamactx's baseline build {_build_path(folder, BASELINE.name)} is missing")
    # Opened as a library, not imported: its module would be the one loaded otherwise.
    probe = ctypes.CDLL(str(_build_path(folder, BASELINE.name))).llamactx_cpu_features
    probe.restype = ctypes.c_char_p
    features = frozenset((probe() or b"").decode().split())
    build, reason = choose(features, available, os.environ.get(FORCE_VARIABLE) or None)
    _import_as_extension(_build_path(folder, build.name))
    return CpuVariant(build.name, reason, tuple(sorted(features)))


def _import_as_extension(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(EXTENSION, str(path))
    spec = importlib.util.spec_from_file_location(EXTENSION, path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[EXTENSION] = module
    loader.exec_module(module)
    # What the import system does for a submodule: the package names it too.
    package, _, name = EXTENSION.rpartition(".")
    setattr(sys.modules[package], name, module)
    return module


def _load_source_build() -> CpuVariant:
    # Imported here, not at the top: the wheel's builds must not be imported by their usual name.
    extension = importlib.import_module(EXTENSION)
    if extension.NATIVE_BUILD:
        reason = "built from source for the machine that compiled it (-march=native without AVX-512 and AMX)"
    else:
        reason = "built from source without the native feature: SSE4.2 kernels"
    return CpuVariant("source", reason, tuple(sorted(extension.cpu_features())))
