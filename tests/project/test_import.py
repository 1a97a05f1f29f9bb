"""What `import llamactx` costs: no numpy until an array is made (numpy's import alone takes
longer than llamactx's; `make bench` measures the time)."""

from __future__ import annotations

import subprocess
import sys

from support.processes import CHILDREN


def test_import_does_not_load_numpy() -> None:
    child = CHILDREN / "import_cost.py"
    result = subprocess.run([sys.executable, str(child)], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "['llamactx']"
