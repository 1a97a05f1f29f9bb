"""Ctrl-C during a 2048-token decode (see test_interrupt.py): prints how long the interrupt
took, what the aborted batch left in the KV cache, and the cache after a later decode."""

from __future__ import annotations

import time

import harness

import llamactx


def ctrl_c_during_a_long_decode(model: llamactx.LlamaModel) -> None:
    ctx = model.new_context(n_ctx=2048, n_batch=2048, n_ubatch=512)
    tokens = model.str_to_token("the quick brown fox jumps over the lazy dog " * 300, False)[:2048]
    batch = llamactx.LlamaBatch(2048)
    batch.add_sequence(tokens, 0, False)
    sent = harness.press_ctrl_c_soon()
    try:
        ctx.decode(batch)
        print("RESULT finished")
    except KeyboardInterrupt:
        print("RESULT interrupted", (time.perf_counter() - sent[0]) * 1000, ctx.kv_cache_seq_pos_max(0))
    small = llamactx.LlamaBatch(8)
    small.add_sequence(tokens[:8], 0, False)
    ctx.decode(small)
    print("AFTER", ctx.kv_cache_seq_pos_max(0))


if __name__ == "__main__":
    harness.run(ctrl_c_during_a_long_decode)
