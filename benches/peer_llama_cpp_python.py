"""tg128 through llama-cpp-python by the protocol of benches/tg_protocol.py, run with ITS
interpreter by benches/compare.py.

    .venv-peers/bin/python benches/peer_llama_cpp_python.py MODEL THREADS

"matched" goes through the low-level API (llama_decode of a one-token batch, the logits row
read); "defaults" is `Llama(model_path).generate`, greedy.
"""

from __future__ import annotations

import sys
import time

import llama_cpp
from tg_protocol import MATCHED, PROMPT, TG, generation_rate, median_of_runs, report


def matched(model: str, threads: int) -> float:
    llm = llama_cpp.Llama(
        model_path=model, **MATCHED, n_threads=threads, n_threads_batch=threads, flash_attn=False, verbose=False
    )
    ctx = llm.ctx
    token = (llama_cpp.llama_token * 1)(llm.token_bos())

    def once() -> float:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        started = time.perf_counter()
        for _ in range(TG):
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(token, 1)) != 0:
                raise RuntimeError("llama_decode failed")
            llama_cpp.llama_get_logits_ith(ctx, -1)
        llama_cpp.llama_synchronize(ctx)
        return TG / (time.perf_counter() - started)

    return median_of_runs(once)


def defaults(model: str) -> float:
    llm = llama_cpp.Llama(model_path=model, verbose=False)
    prompt = llm.tokenize(PROMPT.encode())
    return median_of_runs(lambda: generation_rate(llm.generate(prompt, top_k=1, temp=0.0, reset=True)))


if __name__ == "__main__":
    path, n_threads = sys.argv[1], int(sys.argv[2])
    report(llama_cpp.__version__, matched(path, n_threads), defaults(path))
