"""Child program: aborts a 3-micro-batch decode inside a chosen micro-batch and prints, as JSON,
what the context looks like afterwards.

Usage: abort_in_ubatch.py MODEL_PATH HOW UBATCH (an empty MODEL_PATH: the default model), with
HOW ``callback`` (the abort callback returns True) or ``sigint`` (another thread sends SIGINT, as
Ctrl-C does). The landing is
deterministic, not timed: the abort callback sleeps past llamactx's 5 ms poll interval, so
llamactx polls it after every graph node, and every micro-batch of this shape computes the same
number of nodes (measured first on a one-micro-batch decode).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import harness

import llamactx

N_UBATCH = 32
PREFIX = 8  # cached positions 0..7 before the aborted decode
POLL_INTERVAL_S = 0.0055  # just over llamactx's 5 ms


class NodeCounter:
    """An abort callback that is called after every graph node and counts the calls."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.calls = 0
        self.stop_at = stop_at
        self.reached = threading.Event()

    def __call__(self) -> bool:
        self.calls += 1
        time.sleep(POLL_INTERVAL_S)
        if self.calls == self.stop_at:
            self.reached.set()
        return HOW == "callback" and self.reached.is_set()


def batch_of(tokens: list[int], start: int, seq_id: int, last_logits: bool) -> llamactx.LlamaBatch:
    batch = llamactx.LlamaBatch(len(tokens))
    for i, token in enumerate(tokens):
        batch.add(token, start + i, [seq_id], last_logits and i == len(tokens) - 1)
    return batch


def press_ctrl_c_when(reached: threading.Event) -> None:
    reached.wait()
    os.kill(os.getpid(), signal.SIGINT)


harness.answer_ctrl_c()
MODEL_PATH, HOW, UBATCH = sys.argv[1] or str(llamactx.default_model_path()), sys.argv[2], int(sys.argv[3])
model = llamactx.LlamaModel.load_from_file(MODEL_PATH)
tokens = model.str_to_token("the quick brown fox jumps over the lazy dog " * 20, False)
prefix, body = tokens[:PREFIX], tokens[PREFIX : PREFIX + 3 * N_UBATCH]
ctx = model.new_context(n_ctx=512, n_batch=3 * N_UBATCH, n_ubatch=N_UBATCH, n_threads=1, n_threads_batch=1)

# Nodes per micro-batch: a one-micro-batch decode of the same shape (no outputs), then cleared.
counter = NodeCounter()
ctx.set_abort_callback(counter)
ctx.decode(batch_of(body[:N_UBATCH], 0, 0, False))
nodes = counter.calls
ctx.clear_kv_cache()

ctx.set_abort_callback(None)
ctx.decode(batch_of(prefix, 0, 0, True))
before = ctx.state_seq_get_data(0)

stop_at = UBATCH * nodes + nodes // 2
counter = NodeCounter(stop_at)
ctx.set_abort_callback(counter)
if HOW == "sigint":
    threading.Thread(target=press_ctrl_c_when, args=(counter.reached,), daemon=True).start()
try:
    ctx.decode(batch_of(body, PREFIX, 0, True))
    raised = "none"
except BaseException as error:
    raised = type(error).__name__
ctx.set_abort_callback(None)
after = ctx.state_seq_get_data(0)
pos_max = ctx.kv_cache_seq_pos_max(0)

# The same batch again now decodes as on a context that never saw the aborted one.
ctx.decode(batch_of(body, PREFIX, 0, True))
logits = ctx.get_logits_ith(-1)
fresh = model.new_context(n_ctx=512, n_batch=3 * N_UBATCH, n_ubatch=N_UBATCH, n_threads=1, n_threads_batch=1)
fresh.decode(batch_of(prefix, 0, 0, True))
fresh.decode(batch_of(body, PREFIX, 0, True))
expected = fresh.get_logits_ith(-1)

print(
    json.dumps(
        {
            "nodes_per_ubatch": nodes,
            "aborted_at_call": counter.calls,
            "raised": raised,
            "state_unchanged": before == after,
            "pos_max": pos_max,
            "logits_equal_fresh": bool((logits == expected).all()),
            "max_logit_difference": float(abs(logits - expected).max()),
        }
    )
)
