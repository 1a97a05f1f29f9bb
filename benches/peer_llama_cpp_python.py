"""tg128 through llama-cpp-python, run with ITS interpreter by benches/compare.py.

    .venv-peers/bin/python benches/peer_llama_cpp_python.py MODEL THREADS

Prints JSON: "matched" is the low-level API (one-token llama_decode, logits read) with the
settings llama-bench and compare.py use; "defaults" is `Llama(model_path)` as a user gets it,
generating 128 tokens through `Llama.generate`.
"""

from __future__ import annotations

import json
import sys
import time

import llama_cpp

TG = 128


def matched(model: str, threads: int) -> float:
    llm = llama_cpp.Llama(
        model_path=model, n_ctx=640, n_batch=2048, n_ubatch=512, n_threads=threads, n_threads_batch=threads,
        flash_attn=False, verbose=False,
    )  # fmt: skip
    ctx = llm.ctx
    token = (llama_cpp.llama_token * 1)(llm.token_bos())
    rates = []
    for _ in range(3):
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        started = time.perf_counter()
        for _ in range(TG):
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(token, 1)) != 0:
                raise RuntimeError("llama_decode failed")
            llama_cpp.llama_get_logits_ith(ctx, -1)
        llama_cpp.llama_synchronize(ctx)
        rates.append(TG / (time.perf_counter() - started))
    return sorted(rates)[1]


def defaults(model: str) -> float:
    llm = llama_cpp.Llama(model_path=model, verbose=False)
    prompt = llm.tokenize(b"The capital of France is")
    rates = []
    for _ in range(3):
        llm.reset()
        started = None
        for count, _token in enumerate(llm.generate(prompt, top_k=1, temp=0.0, reset=True)):
            if started is None:
                started = time.perf_counter()  # after the prompt, like a tg figure
            if count == TG:
                break
        assert started is not None
        rates.append(TG / (time.perf_counter() - started))
    return sorted(rates)[1]


if __name__ == "__main__":
    path, n_threads = sys.argv[1], int(sys.argv[2])
    print(
        json.dumps({"version": llama_cpp.__version__, "matched": matched(path, n_threads), "defaults": defaults(path)})
    )
