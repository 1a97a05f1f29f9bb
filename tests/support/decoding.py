"""Decoding a prompt into a context by hand, as the low-level tests need it."""

from __future__ import annotations

import llamactx


def decode_prompt(ctx: llamactx.LlamaContext, tokens: list[int], seq_id: int = 0) -> None:
    """Decodes ``tokens`` into ``seq_id`` from position 0, with logits for the last one."""
    batch = llamactx.LlamaBatch(len(tokens))
    batch.add_sequence(tokens, seq_id, False)
    ctx.decode(batch)
