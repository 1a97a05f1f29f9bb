"""Creating, using and closing contexts does not leak native memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.processes import run_child


@pytest.mark.timeout(700)
def test_500_context_cycles_grow_rss_by_less_than_20_mb(model_path: Path) -> None:
    result = run_child(model_path, "context_cycles", "growth_over_500_cycles", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    growth = float(result.stdout.split("GROWTH ", 1)[1])
    assert growth < 20, f"RSS grew by {growth:.1f} MB"
