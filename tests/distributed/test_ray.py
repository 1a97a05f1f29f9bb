"""Ray Data and Ray Serve on a local Ray (the cases are in ``ray_cases.py``). Ray's servers
listen on every interface, so the cases run where loopback is the only one
(``loopback_only.py``): nothing of the test cluster is reachable from outside."""

from __future__ import annotations

import ast
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from support import background, loopback_only

CASES_FILE = Path(__file__).with_name("ray_cases.py")
CASES = [
    node.name
    for node in ast.parse(CASES_FILE.read_text()).body
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
]
# A case may take the whole suite's time: the Ray Data job ran past pytest's 300 s while a second
# process loaded both CPUs (the job's timeout bounds the run). The cases run beside the other
# tests, on every CPU (``support/background.py``): alone, they took 157 CPU seconds in 106 s.
NAME, SECONDS = "ray_cases", 1500
RAY_CASES = background.Job(
    NAME,
    tuple(
        loopback_only.command(
            "-m",
            "pytest",
            str(CASES_FILE),
            "-o",
            "python_files=ray_cases.py",
            f"--timeout={SECONDS}",
            f"--junitxml={background.report(NAME)}",
        )
    ),
    SECONDS,
)
pytestmark = pytest.mark.background(RAY_CASES)


@pytest.fixture(scope="module")
def outcomes() -> dict[str, str | None]:
    """Each case's failure text (None when it passed), from the job's one run of the cases."""
    done = background.ended(RAY_CASES)
    if done.report is None:
        pytest.fail(f"the Ray cases did not run ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    found: dict[str, str | None] = {}
    for case in ElementTree.fromstring(done.report).iter("testcase"):
        problems = [child for child in case if child.tag in ("failure", "error", "skipped")]
        found[case.get("name", "")] = "\n".join(f"{p.tag}: {p.text or p.get('message')}" for p in problems) or None
    return found


@pytest.mark.timeout(SECONDS + 120)
@pytest.mark.parametrize("case", CASES)
def test_ray(outcomes: dict[str, str | None], case: str) -> None:
    assert case in outcomes, f"{case} did not run"
    assert outcomes[case] is None, outcomes[case]
