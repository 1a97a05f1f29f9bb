"""Median time of one one-token decode (its logits read), with flash attention off and auto, for
the llamactx this interpreter imports: the measure for comparing builds (compile flags, features),
run alternately from each build's venv. A median, unlike tokens/s over a run, ignores the moments
another process took the CPU.

    python benches/decode_latency.py [--model PATH] [--threads 2] [--tokens 300]

Prints one JSON object: the settings and the medians in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import llamactx

FLASH_ATTENTION = {"off": 0, "auto": -1}


def median_decode_ms(model: llamactx.LlamaModel, threads: int, tokens: int, flash_attn: int) -> float:
    """Greedy generation after a short prompt; the median over ``tokens`` decodes."""
    ctx = model.new_context(n_ctx=1024, n_threads=threads, n_threads_batch=threads, flash_attn_type=flash_attn)
    prompt = model.str_to_token("Once upon a time there")
    batch = llamactx.LlamaBatch(len(prompt))
    batch.add_sequence(prompt, 0, False)
    ctx.decode(batch)
    position, token, seconds = len(prompt), prompt[-1], []
    for _ in range(tokens):
        started = time.perf_counter()
        batch.clear()
        batch.add(token, position, [0], True)
        ctx.decode(batch)
        logits = ctx.get_logits_ith(0)
        seconds.append(time.perf_counter() - started)
        token, position = int(np.argmax(logits)), position + 1
    return 1000 * statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=300)
    arguments = parser.parse_args()
    model = llamactx.LlamaModel.load_from_file(arguments.model or llamactx.default_model_path())
    medians = {
        f"flash attention {name} (ms)": median_decode_ms(model, arguments.threads, arguments.tokens, value)
        for name, value in FLASH_ATTENTION.items()
    }
    print(json.dumps({"settings": vars(arguments), **medians}))


if __name__ == "__main__":
    main()
