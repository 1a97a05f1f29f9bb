"""A model on two RPC servers, one of which the test kills mid-decode (see test_rpc.py): prints
when it decodes, the error it got, whether the model then refuses work, and whether a reload on
the remaining server generates what the local model does. The endpoints come on stdin."""

from __future__ import annotations

import json
import sys

import harness

import llamactx

PROMPT = "The capital of France is"


def server_killed_mid_decode(local: llamactx.LlamaModel) -> None:
    endpoints: list[str] = json.loads(sys.stdin.readline())
    with local.new_context(n_ctx=256) as local_ctx:
        expected = llamactx.generate(local_ctx, PROMPT, max_tokens=16)
    model = llamactx.LlamaModel.load_from_file(local.path, rpc_servers=endpoints, rpc_timeout=30)
    ctx = model.new_context(n_ctx=1024, n_batch=512)
    tokens = model.str_to_token("the quick brown fox jumps over the lazy dog " * 60, False)[:512]
    batch = llamactx.LlamaBatch(512)
    batch.add_sequence(tokens, 0, False)
    print("DECODING", flush=True)
    try:
        while True:
            ctx.clear_kv_cache()
            ctx.decode(batch)
    except llamactx.RpcError as error:
        print("RAISED", json.dumps(str(error)), flush=True)
    try:
        llamactx.generate(ctx, PROMPT, max_tokens=4)
        print("REFUSED false", flush=True)
    except llamactx.RpcError:
        print("REFUSED true", flush=True)
    ctx.close()
    model.close()
    survivor = llamactx.LlamaModel.load_from_file(local.path, rpc_servers=endpoints[:1])
    with survivor.new_context(n_ctx=256) as survivor_ctx:
        print("RELOADED", json.dumps(llamactx.generate(survivor_ctx, PROMPT, max_tokens=16) == expected), flush=True)


if __name__ == "__main__":
    harness.run(server_killed_mid_decode)
