"""Builds the portable x86-64 Linux wheel: one build of the extension per CPU level, in one wheel.

Each build in ``llamactx._cpu.BUILDS`` is compiled by ``maturin build --zig`` for glibc 2.28
(manylinux_2_28: RHEL 8 and later), with llama.cpp's kernels compiled for its CPU level; each
has its own cargo target directory, so rebuilding one reuses its cache. The wheels differ only
in ``llamactx/_llamactx.abi3.so``; this script keeps the baseline wheel's files and puts each
build's extension in ``llamactx/_cpu_builds/NAME.abi3.so``, where ``llamactx._cpu`` picks one
at import.

    python scripts/portable_wheel.py --out dist --targets ~/.cache/llamactx/wheel

The build tools (maturin, zig, cmake, libclang) come from a virtual environment of their own
in the targets folder, made on first use: see ``toolchain``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType

import tomllib  # Python 3.11: the wheel is built with the development venv's Python

ROOT = Path(__file__).resolve().parents[1]
EXTENSION_FILE = "llamactx/_llamactx.abi3.so"
#: The most a wheel may weigh (issue 28); PyPI's default limit is 100 MB.
MAX_WHEEL_BYTES = 64 * 2**20
MANYLINUX = "manylinux_2_28"
MANYLINUX_GLIBC = (2, 28)


def cpu_module() -> ModuleType:
    """``python/llamactx/_cpu.py``, loaded from its file: the package itself needs an extension."""
    spec = importlib.util.spec_from_file_location("llamactx_cpu", ROOT / "python" / "llamactx" / "_cpu.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def toolchain(folder: Path) -> Path:
    """A virtual environment at a fixed path with the build's tools (the build backend's own
    requirements and zig), made once: maturin names its zig compiler wrappers after its own
    path, and CMake's caches keep the compiler's and cmake's paths, so builds from any checkout
    (CI's fresh clones) find the same names and reuse the cached builds."""
    python = folder / "bin" / "python"
    done = folder / ".installed"
    if not done.exists():
        with (ROOT / "pyproject.toml").open("rb") as pyproject:
            requirements = tomllib.load(pyproject)["build-system"]["requires"]
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *requirements, "ziglang"], check=True)
        done.touch()
    return folder


def build(name: str, cflags: str, tools: Path, target_dir: Path, out: Path) -> Path:
    """One wheel, with llama.cpp compiled with ``cflags`` by the tools in ``tools``; returns its
    path."""
    # maturin's zig wrapper asks for debug information (-g), which --strip then drops: -g0
    # spares compiling it. zig's clang keeps frame pointers by default, gcc's -O3 does not: each
    # small kernel call (a quantized dot product per row and column) would pay for its frame.
    flags = f"{cflags} -g0 -fomit-frame-pointer"
    environ = {
        **os.environ,
        "PATH": f"{tools / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "CFLAGS": flags,
        "CXXFLAGS": flags,
        "CARGO_TARGET_DIR": str(target_dir),
    }
    command = [
        *("maturin", "build", "--release", "--strip", "--quiet", "--no-default-features"),
        *("--zig", "--compatibility", MANYLINUX, "--out", str(out)),
    ]
    print(f"portable_wheel: building {name} ({cflags}) in {target_dir}", flush=True)
    builder = [str(tools / "bin" / "python"), str(ROOT / "scripts" / "llamactx_build.py")]
    subprocess.run([*builder, *command], env=environ, check=True)
    (wheel,) = out.glob("*.whl")
    return wheel


def comparable(path: str, files: dict[str, bytes]) -> object:
    """A wheel file's content, less what differs between two builds of the same source: the
    serial number and time maturin stamps on its software bill of materials."""
    data = files.get(path)
    if data is None or "/sboms/" not in path:
        return data
    sbom = json.loads(data)
    sbom.pop("serialNumber", None)
    sbom.get("metadata", {}).pop("timestamp", None)
    return sbom


def merge(wheels: dict[str, Path], baseline: str, folder: str, out: Path) -> Path:
    """The baseline wheel with every build's extension under ``llamactx/<folder>/``, each with
    the baseline extension's file attributes (its permissions)."""
    with zipfile.ZipFile(wheels[baseline]) as source:
        infos = {info.filename: info for info in source.infolist()}
        contents = {name: source.read(info) for name, info in infos.items()}
    record = next(name for name in infos if name.endswith(".dist-info/RECORD"))
    entries = [(info, contents[name]) for name, info in infos.items() if name not in (record, EXTENSION_FILE)]
    for name, wheel in wheels.items():
        with zipfile.ZipFile(wheel) as other:
            others = {info.filename: other.read(info) for info in other.infolist()}
        differing = sorted(
            path
            for path in (contents.keys() | others.keys()) - {record}
            if comparable(path, contents) != comparable(path, others)
        )
        if set(differing) - {EXTENSION_FILE}:
            raise SystemExit(f"portable_wheel: {wheel.name} differs from the baseline in {differing}")
        entries.append((renamed(infos[EXTENSION_FILE], f"llamactx/{folder}/{name}.abi3.so"), others[EXTENSION_FILE]))
    target = out / wheels[baseline].name
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as merged:
        lines = []
        for info, data in entries:
            merged.writestr(info, data, zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{info.filename},sha256={digest},{len(data)}")
        lines.append(f"{record},,")
        merged.writestr(infos[record], "\n".join(lines) + "\n", zipfile.ZIP_DEFLATED)
    return target


def renamed(info: zipfile.ZipInfo, path: str) -> zipfile.ZipInfo:
    """``info`` for another path: the same time and attributes."""
    copy = zipfile.ZipInfo(path, info.date_time)
    copy.external_attr = info.external_attr
    return copy


def manylinux_glibc(wheel: Path) -> tuple[int, int]:
    """The oldest glibc the wheel runs on, as ``auditwheel show`` (PyPA's own check) finds it."""
    shown = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r'platform tag: "manylinux_(\d+)_(\d+)_', " ".join(shown.split()))
    if found is None:
        raise SystemExit(f"portable_wheel: auditwheel finds no manylinux tag for {wheel}:\n{shown}")
    return int(found[1]), int(found[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("dist"), help="where the wheel goes")
    parser.add_argument("--targets", type=Path, required=True, help="the cargo target directories, one per build")
    arguments = parser.parse_args()
    cpu = cpu_module()
    arguments.out.mkdir(parents=True, exist_ok=True)
    tools = toolchain(arguments.targets / "toolchain")
    with tempfile.TemporaryDirectory() as scratch:
        wheels = {
            spec.name: build(spec.name, spec.cflags, tools, arguments.targets / spec.name, Path(scratch) / spec.name)
            for spec in reversed(cpu.BUILDS)  # the baseline first
        }
        wheel = merge(wheels, cpu.BASELINE.name, cpu.BUILDS_FOLDER, arguments.out)
    size = wheel.stat().st_size
    if size > MAX_WHEEL_BYTES:
        raise SystemExit(f"portable_wheel: {wheel} weighs {size / 2**20:.1f} MiB, over {MAX_WHEEL_BYTES / 2**20:.0f}")
    glibc = manylinux_glibc(wheel)
    if glibc > MANYLINUX_GLIBC:
        raise SystemExit(f"portable_wheel: {wheel} needs glibc {glibc}, newer than {MANYLINUX}")
    print(f"portable_wheel: {wheel} ({size / 2**20:.1f} MiB, builds: {', '.join(wheels)}; auditwheel: glibc {glibc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
