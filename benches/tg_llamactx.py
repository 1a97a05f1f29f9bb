"""tg128 through llamactx by the protocol of benches/tg_protocol.py, run by benches/compare.py.

python benches/tg_llamactx.py MODEL THREADS
"""

from __future__ import annotations

import sys

from tg_protocol import MATCHED, PROMPT, TG, generation_rate, median_of_runs, report

import llamactx
from llamactx.bench import generation_speed


def matched(model: llamactx.LlamaModel, threads: int) -> float:
    ctx = model.new_context(**MATCHED, n_threads=threads, n_threads_batch=threads, flash_attn_type=0)
    return median_of_runs(lambda: generation_speed(ctx, TG, model.token_bos()))


def defaults(model: llamactx.LlamaModel) -> float:
    ctx = model.new_context()
    return median_of_runs(lambda: generation_rate(llamactx.stream(ctx, PROMPT, max_tokens=TG + 1)))


if __name__ == "__main__":
    path, n_threads = sys.argv[1], int(sys.argv[2])
    loaded = llamactx.LlamaModel.load_from_file(path)  # with no arguments, as a user loads it
    report(llamactx.__version__, matched(loaded, n_threads), defaults(loaded))
