"""The test suite's time per file, for docs/testing.md: runs pytest with ``--durations=0`` (or
reads a log of such a run) and prints a markdown table of the files, slowest first, with their
seconds (setup, call and teardown together), tests and share of the whole.

    python scripts/test_profile.py [--log FILE] [PYTEST ARGS...]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
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


def table(files: dict[str, tuple[float, set[str]]]) -> str:
    whole = sum(seconds for seconds, _ in files.values()) or 1.0
    lines = ["| file | seconds | tests | share |", "|---|---:|---:|---:|"]
    for path, (seconds, tests) in sorted(files.items(), key=lambda item: -item[1][0]):
        lines.append(f"| `{path}` | {seconds:.1f} | {len(tests)} | {100 * seconds / whole:.1f} % |")
    lines.append(f"| all | {whole:.1f} | {sum(len(tests) for _, tests in files.values())} | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", type=Path, help="a log of `pytest --durations=0` to read instead of running it")
    arguments, pytest_arguments = parser.parse_known_args()
    if arguments.log is not None:
        report = arguments.log.read_text()
        status = 0
    else:
        ran = subprocess.run(
            [sys.executable, "-m", "pytest", "--durations=0", "-q", *pytest_arguments],
            capture_output=True,
            text=True,
            check=False,
        )
        report, status = ran.stdout, ran.returncode
        failures = [line for line in report.splitlines() if line.startswith(("FAILED ", "ERROR "))]
        print(*failures, report.splitlines()[-1] if report else ran.stderr, sep="\n", file=sys.stderr)
    print(table(per_file(report)))
    return status


if __name__ == "__main__":
    sys.exit(main())
