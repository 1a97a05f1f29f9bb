"""The test suite's time per file, for docs/testing.md: runs pytest with ``--durations=0`` (or
reads a log of such a run) and prints a markdown table of the files, slowest first, with their
seconds (setup, call and teardown together), tests and share of the whole; for a run it made,
also the CPU seconds each file's tests took, theirs and their children's (``tests/conftest.py``
records them where ``LLAMACTX_TEST_CPU_LOG`` says).

    python scripts/test_profile.py [--log FILE] [PYTEST ARGS...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

#: A line of pytest's durations report: "12.34s call     tests/test_x.py::test_y[param]".
DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+?)::(\S+)")


def per_file(report: str) -> dict[str, tuple[float, set[str]]]:
    """Seconds and the test ids seen, per file, from a durations report."""
    files: dict[str, tuple[float, set[str]]] = defaultdict(lambda: (0.0, set()))
    for line in report.splitlines():
        if match := DURATION.match(line.strip()):
            seconds, _phase, path, test = match.groups()
            total, tests = files[path]
            tests.add(test)
            files[path] = (total + float(seconds), tests)
    return dict(files)


def cpu_per_file(folder: Path) -> dict[str, float]:
    """CPU seconds per file, from the records of every process of a run."""
    files: dict[str, float] = defaultdict(float)
    for record in folder.glob("*.tsv"):
        for line in record.read_text().splitlines():
            seconds, test = line.split("\t", 1)
            files[test.split("::", 1)[0]] += float(seconds)
    return dict(files)


def table(files: dict[str, tuple[float, set[str]]], cpu: dict[str, float] | None = None) -> str:
    whole = sum(seconds for seconds, _ in files.values()) or 1.0
    rows = [["file", "seconds", "CPU seconds", "tests", "share"]]
    for path, (seconds, tests) in sorted(files.items(), key=lambda item: -item[1][0]):
        used = (cpu or {}).get(path, 0.0)
        rows.append([f"`{path}`", f"{seconds:.1f}", f"{used:.1f}", str(len(tests)), f"{100 * seconds / whole:.1f} %"])
    tests = sum(len(tests) for _, tests in files.values())
    rows.append(["all", f"{whole:.1f}", f"{sum((cpu or {}).values()):.1f}", str(tests), ""])
    if cpu is None:  # a log read afterwards has no CPU records
        rows = [row[:2] + row[3:] for row in rows]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|---|" + "---:|" * (len(rows[0]) - 1))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", type=Path, help="a log of `pytest --durations=0` to read instead of running it")
    arguments, pytest_arguments = parser.parse_known_args()
    if arguments.log is not None:
        print(table(per_file(arguments.log.read_text())))
        return 0
    with tempfile.TemporaryDirectory() as records:
        ran = subprocess.run(
            [sys.executable, "-m", "pytest", "--durations=0", "-q", *pytest_arguments],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "LLAMACTX_TEST_CPU_LOG": records},
        )
        cpu = cpu_per_file(Path(records))
    report = ran.stdout
    failures = [line for line in report.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    print(*failures, report.splitlines()[-1] if report else ran.stderr, sep="\n", file=sys.stderr)
    print(table(per_file(report), cpu))
    return ran.returncode


if __name__ == "__main__":
    sys.exit(main())
