"""pp/tg tokens/s through llamactx's low-level API, like llama-bench.

    python benches/throughput.py [--model PATH] [--threads N] [--pp 512] [--tg 128] [--reps 3]

Prints one JSON object with the settings and the medians.
"""

from __future__ import annotations

import argparse
import json

import llamactx
from llamactx.bench import speeds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pp", type=int, default=512)
    parser.add_argument("--tg", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--flash-attn", type=int, default=0, help="-1 auto, 0 off (llama-bench's default), 1 on")
    arguments = parser.parse_args()
    model = llamactx.LlamaModel.load_from_file(arguments.model or llamactx.default_model_path())
    ctx = model.new_context(
        n_ctx=arguments.pp + arguments.tg,
        n_batch=arguments.pp,
        n_threads=arguments.threads,
        n_threads_batch=arguments.threads,
        flash_attn_type=arguments.flash_attn,
    )
    result = speeds(ctx, pp=arguments.pp, tg=arguments.tg, repetitions=arguments.reps)
    print(json.dumps({"settings": vars(arguments), **result}, indent=2))


if __name__ == "__main__":
    main()
