"""KV cache types (llama-server's ``--cache-type-k/--cache-type-v``, the context's
``cache_type_k``/``cache_type_v``), in one run, on the default model: the KV cache's bytes at a
4096-token context, and how closely each quantized type's greedy replies follow f16's on the same
chats (the share of tokens generated before the reply first differs from f16's, and the replies
equal to f16's whole). A quantized V cache needs flash attention, so every type runs with it;
f16 without flash attention, whose sums are ordered otherwise, shows how far replies part on
rounding alone on this tiny model.

    python benches/kv_cache_types.py [--tokens 64] [--out bench-results]

Writes kv_cache_types.json into --out; memory ratios are against f16 (< 1: smaller).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import llamactx

#: Each variant: its name, the K and V type, and flash attention (llama.cpp's ``flash_attn_type``).
VARIANTS = (("f16", "f16", 1), ("f16, no flash attention", "f16", 0), ("q8_0", "q8_0", 1), ("q4_0", "q4_0", 1))
N_CTX = 4096
CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a prime number is.",
    "List three colours of the rainbow.",
    "How do I boil an egg?",
    "Name a famous painter and one of their works.",
    "What does a CPU do?",
    "Give me a tip for learning a language.",
]


def kv_bytes(ctx: llamactx.LlamaContext) -> int:
    """The bytes the context's own buffers hold: its KV cache (the model's weights and the
    compute buffers are counted apart)."""
    return sum(int(entry["context"]) for entry in ctx.memory_breakdown())


def replies(model: llamactx.LlamaModel, cache_type: str, flash: int, tokens: int) -> tuple[int, list[list[int]]]:
    """The KV bytes of a context with ``cache_type`` for K and V (and ``flash`` attention), and
    its greedy replies (as tokens) to ``CHATS``."""
    ctx = model.new_context(n_ctx=N_CTX, cache_type_k=cache_type, cache_type_v=cache_type, flash_attn_type=flash)
    answers = []
    for question in CHATS:
        ctx.clear_kv_cache()
        text = llamactx.chat(ctx, [("user", question)], max_tokens=tokens)
        answers.append(model.str_to_token(text, False))
    return kv_bytes(ctx), answers


def agreement(reference: list[list[int]], other: list[list[int]]) -> tuple[float, int]:
    """The share of ``reference``'s tokens that ``other`` generated before first differing, and
    how many replies are equal whole."""
    kept = 0
    for ours, theirs in zip(reference, other, strict=True):
        same = 0
        while same < min(len(ours), len(theirs)) and ours[same] == theirs[same]:
            same += 1
        kept += same
    return kept / sum(len(reply) for reply in reference), sum(a == b for a, b in zip(reference, other, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    arguments = parser.parse_args()
    model = llamactx.LlamaModel.load_from_file(llamactx.default_model_path())
    measured = {name: replies(model, kind, flash, arguments.tokens) for name, kind, flash in VARIANTS}
    base_bytes, base_replies = measured["f16"]
    results = {}
    for cache_type, (size, answers) in measured.items():
        share, whole = agreement(base_replies, answers)
        results[cache_type] = {
            "kv_bytes": size,
            "kv_ratio_vs_f16": size / base_bytes,
            "tokens_before_first_difference": share,
            "replies_equal_to_f16": f"{whole}/{len(CHATS)}",
        }
        print(
            f"{cache_type:24} KV {size / 2**20:6.1f} MiB ({size / base_bytes:.2f}x f16), greedy tokens before the "
            f"first difference from f16: {share:.0%}, replies equal whole: {whole}/{len(CHATS)}"
        )
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "kv_cache_types.json").write_text(json.dumps({"n_ctx": N_CTX, "types": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
