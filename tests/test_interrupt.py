"""Ctrl-C stops a long decode quickly, raises KeyboardInterrupt, and leaves the context usable."""

from __future__ import annotations

from pathlib import Path

from conftest import run_isolated

SCRIPT = """
import os, signal, threading, time
ctx = model.new_context(n_ctx=2048, n_batch=2048, n_ubatch=512)
tokens = model.str_to_token("the quick brown fox jumps over the lazy dog " * 300, False)[:2048]
batch = llamactx.LlamaBatch(2048)
batch.add_sequence(tokens, 0, False)
sent = []

def press_ctrl_c():
    time.sleep(0.5)
    sent.append(time.perf_counter())
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=press_ctrl_c).start()
try:
    ctx.decode(batch)
    print("RESULT finished")
except KeyboardInterrupt:
    print("RESULT interrupted", (time.perf_counter() - sent[0]) * 1000, ctx.kv_cache_seq_pos_max(0))
small = llamactx.LlamaBatch(8)
small.add_sequence(tokens[:8], 0, False)
ctx.decode(small)
print("AFTER", ctx.kv_cache_seq_pos_max(0))
"""


def test_sigint_interrupts_a_2048_token_decode_within_250_ms(model_path: Path) -> None:
    result = run_isolated(model_path, SCRIPT)
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = result.stdout.split("RESULT ", 1)[1].split()
    assert outcome[0] == "interrupted", "the decode finished: the 2048-token prompt took under 0.5 s?"
    latency_ms, pos_max = float(outcome[1]), int(outcome[2])
    assert latency_ms < 250
    assert pos_max == -1  # no half-written tokens of the aborted batch
    assert "AFTER 7" in result.stdout  # and the context still decodes
