"""The portable wheel: one build per CPU level, the best one this CPU can run chosen at import.

The choice and the wheel's assembly are checked everywhere; the builds themselves only where
llamactx runs from that wheel (``make test-wheel``): natively, forced to each build, and under
QEMU as older CPUs, where every run must give the same greedy text.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.processes import load_script
from support.prompts import DEMO_ANSWER, DEMO_QUESTION

import llamactx
from llamactx import _cpu

V2 = _cpu.BASELINE.needs
V3 = next(build.needs for build in _cpu.BUILDS if build.name == "x86-64-v3")
ALL_BUILDS = frozenset(build.name for build in _cpu.BUILDS)
FROM_WHEEL = llamactx.cpu_variant().name != "source"
needs_wheel = pytest.mark.skipif(not FROM_WHEEL, reason="runs where llamactx is the portable wheel (make test-wheel)")

#: One greedy generation and the greedy answer to ``make demo``'s question (argv[2]); prints the
#: build that ran them, the text and the answer, as JSON.
GENERATE = """
import json, sys, llamactx
model = llamactx.LlamaModel.load_from_file(sys.argv[1])
with model.new_context(n_ctx=256, n_threads=2) as ctx:
    text = llamactx.generate(ctx, "The capital of France is", max_tokens=12)
    answer = llamactx.chat(ctx, [("user", sys.argv[2])], max_tokens=32)
print(json.dumps({"build": llamactx.cpu_variant().name, "text": text, "answer": answer}))
"""


def test_the_best_build_the_cpu_runs_is_chosen() -> None:
    assert _cpu.choose(V3 | {"avxvnni"}, ALL_BUILDS)[0].name == "x86-64-v3-avxvnni"
    build, reason = _cpu.choose(V3 | {"avx512f"}, ALL_BUILDS)
    assert build.name == "x86-64-v3"
    assert "x86-64-v3-avxvnni would need avxvnni" in reason
    assert "AVX-512 is not used" in reason
    assert _cpu.choose(V2 | {"avx", "avx2"}, ALL_BUILDS)[0].name == "x86-64-v2"
    assert _cpu.choose(V3 | {"avxvnni"}, frozenset({"x86-64-v2"}))[0].name == "x86-64-v2"


def test_a_cpu_without_the_baseline_is_refused_by_name() -> None:
    with pytest.raises(ImportError, match=r"needs an x86-64-v2 CPU .* lacks cmpxchg16b, popcnt, sse4\.2"):
        _cpu.choose(V2 - {"sse4.2", "popcnt", "cmpxchg16b"}, ALL_BUILDS)


def test_a_forced_build_must_exist_and_run_here() -> None:
    assert _cpu.choose(V3, ALL_BUILDS, "x86-64-v2") == (_cpu.BASELINE, "chosen by LLAMACTX_CPU_BUILD=x86-64-v2")
    with pytest.raises(ImportError, match="this CPU lacks avx, avx2"):
        _cpu.choose(V2, ALL_BUILDS, "x86-64-v3")
    with pytest.raises(ImportError, match="names no build of this wheel"):
        _cpu.choose(V3, ALL_BUILDS, "x86-64-v4")


def test_no_build_uses_avx512_or_amx() -> None:
    # AVX-512 measured no faster and slower for f16 flash attention; AMX dies with SIGILL where
    # the kernel has not granted it (docs/llama-internals.md).
    for build in _cpu.BUILDS:
        assert not any(feature.startswith(("avx512", "amx")) for feature in build.needs), build
        assert "avx512" not in build.cflags, build
        assert "amx" not in build.cflags, build


def test_the_variant_names_what_this_process_runs() -> None:
    # Whichever build was imported, the package names it as the import system would.
    assert llamactx._llamactx is sys.modules["llamactx._llamactx"]
    variant = llamactx.cpu_variant()
    assert variant.name in ALL_BUILDS | {"source"}
    assert {"sse4.2", "popcnt"} <= set(variant.features)
    assert variant.reason


SBOM = "llamactx-0.1.0.dist-info/sboms/llamactx.cyclonedx.json"


def fake_wheel(path: Path, extension: bytes, *, readme: str = "same", serial: str = "1", crate: str = "same") -> Path:
    sbom = {"serialNumber": serial, "metadata": {"timestamp": serial}, "components": [crate]}
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("llamactx/__init__.py", readme)
        executable = zipfile.ZipInfo("llamactx/_llamactx.abi3.so")
        executable.external_attr = 0o755 << 16
        wheel.writestr(executable, extension)
        wheel.writestr(SBOM, json.dumps(sbom))
        wheel.writestr("llamactx-0.1.0.dist-info/RECORD", "stale")
    return path


def test_the_merged_wheel_holds_every_build_and_a_true_record(tmp_path: Path) -> None:
    portable_wheel = load_script("portable_wheel")
    builds = {
        "fast": fake_wheel(tmp_path / "fast.whl", b"FAST", serial="2"),  # SBOMs are stamped per build
        "base": fake_wheel(tmp_path / "base.whl", b"BASE"),
    }
    out = tmp_path / "out"
    out.mkdir()
    merged = portable_wheel.merge(builds, "base", "_cpu_builds", out)
    with zipfile.ZipFile(merged) as wheel:
        names = set(wheel.namelist())
        assert "llamactx/_llamactx.abi3.so" not in names
        assert wheel.read("llamactx/_cpu_builds/fast.abi3.so") == b"FAST"
        assert wheel.read("llamactx/_cpu_builds/base.abi3.so") == b"BASE"
        assert wheel.getinfo("llamactx/_cpu_builds/fast.abi3.so").external_attr == 0o755 << 16
        record = wheel.read("llamactx-0.1.0.dist-info/RECORD").decode().splitlines()
    assert {line.split(",")[0] for line in record} == names
    assert "llamactx/_cpu_builds/fast.abi3.so,sha256=" in "\n".join(record)


def test_builds_that_differ_beyond_the_extension_are_not_merged(tmp_path: Path) -> None:
    portable_wheel = load_script("portable_wheel")
    builds = {
        "fast": fake_wheel(tmp_path / "fast.whl", b"FAST", readme="other"),
        "base": fake_wheel(tmp_path / "base.whl", b"BASE"),
    }
    with pytest.raises(SystemExit, match=r"differs from the baseline in \['llamactx/__init__.py'"):
        portable_wheel.merge(builds, "base", "_cpu_builds", tmp_path)
    builds["fast"] = fake_wheel(tmp_path / "fast.whl", b"FAST", crate="other")
    with pytest.raises(SystemExit, match=r"differs from the baseline in .*cyclonedx"):
        portable_wheel.merge(builds, "base", "_cpu_builds", tmp_path)


def generate(model_path: Path, *prefix: str, build: str | None = None) -> dict[str, str]:
    environ = {key: value for key, value in os.environ.items() if key != _cpu.FORCE_VARIABLE}
    if build is not None:
        environ[_cpu.FORCE_VARIABLE] = build
    done = subprocess.run(
        [*prefix, sys.executable, "-c", GENERATE, str(model_path), DEMO_QUESTION],
        capture_output=True,
        text=True,
        env=environ,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return result


@needs_wheel
def test_every_build_this_cpu_runs_gives_the_same_text(model_path: Path) -> None:
    """The same greedy text, and ``make demo``'s answer, from every build."""
    native = generate(model_path)
    assert native["build"] == llamactx.cpu_variant().name
    assert native["text"].strip()
    assert native["answer"] == DEMO_ANSWER
    features = frozenset(llamactx.cpu_variant().features)
    for build in _cpu.BUILDS:
        if build.needs <= features:
            assert generate(model_path, build=build.name) == {**native, "build": build.name}


@needs_wheel
@pytest.mark.timeout(1500)
@pytest.mark.parametrize(("cpu", "build"), [("Nehalem", "x86-64-v2"), ("Haswell", "x86-64-v3")])
def test_older_cpus_run_their_build_and_give_the_same_text(model_path: Path, cpu: str, build: str) -> None:
    qemu = shutil.which("qemu-x86_64")
    assert qemu, "qemu-x86_64 runs the wheel as an older CPU: install Debian's qemu-user (.ci/run does)"
    assert generate(model_path, qemu, "-cpu", cpu) == {**generate(model_path), "build": build}
