"""What `import llamactx` costs: no numpy until an array is made (numpy's import alone takes
longer than llamactx's; `make bench` measures the time)."""

from __future__ import annotations

import subprocess
import sys


def test_import_does_not_load_numpy() -> None:
    code = "import sys, llamactx; print(sorted(m for m in ('numpy', 'llamactx') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "['llamactx']"
