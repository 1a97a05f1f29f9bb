"""A child process for benches/wheel.py: loads the model and a context with llama-bench's
settings once, then answers each line ``pp`` or ``tg`` on stdin with one measurement's tokens/s
(pp512: one 512-token decode; tg128: 128 one-token decodes) on stdout.

Kept alive between measurements so the parent can alternate builds measurement by measurement:
this VM's speed drifts by ±10 % within minutes, and two figures taken seconds apart drift alike.

    python benches/speed_worker.py MODEL THREADS
"""

from __future__ import annotations

import sys

import llamactx
from llamactx.bench import generation_speed, prompt_speed

PP, TG = 512, 128
READY = "ready"


def main() -> None:
    path, threads = sys.argv[1], int(sys.argv[2])
    model = llamactx.LlamaModel.load_from_file(path)
    ctx = model.new_context(n_ctx=PP + TG, n_batch=PP, n_threads=threads, n_threads_batch=threads, flash_attn_type=0)
    token = model.token_bos()
    prompt_speed(ctx, 16, token)  # warm-up, as llama-bench does
    print(READY, flush=True)
    measures = {"pp": lambda: prompt_speed(ctx, PP, token), "tg": lambda: generation_speed(ctx, TG, token)}
    for line in sys.stdin:
        print(measures[line.strip()](), flush=True)


if __name__ == "__main__":
    main()
