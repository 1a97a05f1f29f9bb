"""Ctrl-C stops a long decode quickly, raises KeyboardInterrupt, and leaves the context usable."""

from __future__ import annotations

from pathlib import Path

from support.processes import run_child


def test_sigint_interrupts_a_2048_token_decode_within_250_ms(model_path: Path) -> None:
    result = run_child(model_path, "sigint_during_decode", "ctrl_c_during_a_long_decode")
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = result.stdout.split("RESULT ", 1)[1].split()
    assert outcome[0] == "interrupted", "the decode finished: the 2048-token prompt took under 0.5 s?"
    latency_ms, pos_max = float(outcome[1]), int(outcome[2])
    assert latency_ms < 250
    assert pos_max == -1  # no half-written tokens of the aborted batch
    assert "AFTER 7" in result.stdout  # and the context still decodes
