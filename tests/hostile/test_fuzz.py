"""Random programs of API calls with hostile arguments find no crash, panic or undocumented
exception. The examples run in a child process (``support/children/fuzz.py``): a crash fails this test
and names the call that caused it. ``make fuzz`` runs more examples."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import CHILDREN

#: In ``make test``, its share of the suite's time: about 10 s of a parallel worker.
#: Hypothesis's programs grow as a run goes on: 600 took 77 s, the later ones running hostile
#: templates to the work limit (33 template calls, where the first 300 made 7). The limits
#: themselves are ``test_work_limit.py``'s and the misuse cases'; ``make fuzz`` runs 20,000.
#: Its contexts compute with a thread per CPU the process may use, up to two: one in a parallel
#: worker (so its programs' thread settings above one are refused there), two in ``make fuzz``.
EXAMPLES = int(os.environ.get("LLAMACTX_FUZZ_EXAMPLES", "300"))
CHILD = CHILDREN / "fuzz.py"


@pytest.mark.timeout(3700)
def test_random_api_programs_never_crash(model_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(CHILD), str(model_path), str(EXAMPLES)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    calls = [line for line in result.stdout.splitlines() if line.startswith("CALL ")]
    tail = "\n".join(calls[-8:])
    assert result.returncode == 0, f"exit {result.returncode} after:\n{tail}\n{result.stderr[-3000:]}"
    assert "FUZZ DONE" in result.stdout
    assert len(calls) > EXAMPLES, "the programs made too few calls to mean anything"
