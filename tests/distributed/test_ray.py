"""Ray Data and Ray Serve on a local Ray (the cases are in ``ray_cases.py``). Ray's servers
listen on every interface, so the cases run where loopback is the only one
(``loopback_only.py``): nothing of the test cluster is reachable from outside."""

from __future__ import annotations

import ast
import subprocess
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from support import loopback_only

CASES_FILE = Path(__file__).with_name("ray_cases.py")
CASES = [
    node.name
    for node in ast.parse(CASES_FILE.read_text()).body
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
]
SECONDS = 1500
pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    """Each case's failure text (None when it passed), from one run of the cases."""
    report = tmp_path_factory.mktemp("ray") / "report.xml"
    # A case may take the whole suite's time: the Ray Data job ran past pytest's 300 s while a
    # second process loaded both CPUs (SECONDS bounds the run). The cases compute (about two
    # minutes of a CPU): run as a background job beside both workers, Serve's proxy missed its
    # start-up deadline in a fresh clone's run, so they keep to this worker's CPU.
    pytest_run = [
        "-m",
        "pytest",
        str(CASES_FILE),
        "-o",
        "python_files=ray_cases.py",
        f"--timeout={SECONDS}",
        f"--junitxml={report}",
    ]
    done = subprocess.run(
        loopback_only.command(*pytest_run),
        capture_output=True,
        text=True,
        timeout=SECONDS,
        check=False,
    )
    if not report.exists():
        pytest.fail(f"the Ray cases did not run ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    found: dict[str, str | None] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        problems = [child for child in case if child.tag in ("failure", "error", "skipped")]
        found[case.get("name", "")] = "\n".join(f"{p.tag}: {p.text or p.get('message')}" for p in problems) or None
    return found


@pytest.mark.timeout(SECONDS + 60)
@pytest.mark.parametrize("case", CASES)
def test_ray(outcomes: dict[str, str | None], case: str) -> None:
    assert case in outcomes, f"{case} did not run"
    assert outcomes[case] is None, outcomes[case]
