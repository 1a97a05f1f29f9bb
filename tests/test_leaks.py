"""Creating, using and closing contexts does not leak native memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_isolated

SCRIPT = """
import os

def rss_mb():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

tokens = model.str_to_token("The capital of France is", False)

def cycle():
    ctx = model.new_context(n_ctx=256, n_threads=1)
    batch = llamactx.LlamaBatch(len(tokens))
    batch.add_sequence(tokens, 0, False)
    ctx.decode(batch)
    ctx.get_logits()
    ctx.close()

for _ in range(50):
    cycle()
before = rss_mb()
for _ in range(500):
    cycle()
print("GROWTH", rss_mb() - before)
"""


@pytest.mark.timeout(700)
def test_500_context_cycles_grow_rss_by_less_than_20_mb(model_path: Path) -> None:
    result = run_isolated(model_path, SCRIPT, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    growth = float(result.stdout.split("GROWTH ", 1)[1])
    assert growth < 20, f"RSS grew by {growth:.1f} MB"
