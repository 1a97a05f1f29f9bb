"""An engine with a LoRA adapter (``Engine(lora_adapter=..., lora_scale=...)``, ``serve --lora``):
every request is generated as a context with that adapter set generates it. The synthetic
adapter (``synthetic.write_lora_for_smollm2``) changes SmolLM2's greedy text within 16 tokens."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support.prompts import PARIS_PROMPT

import llamactx


def test_every_request_is_generated_with_the_adapter(model: llamactx.LlamaModel, lora_path: Path) -> None:
    adapter = model.lora_adapter_init(lora_path)
    prompt = model.str_to_token(PARIS_PROMPT, True)
    ctx = model.new_context(n_ctx=512)
    ctx.lora_adapter_set(adapter, 1.0)
    adapted = llamactx.generate(ctx, prompt, max_tokens=16)
    ctx.lora_adapter_set(adapter, 0.5)
    halved = llamactx.generate(ctx, prompt, max_tokens=16)
    ctx.lora_adapter_remove(adapter)
    plain = llamactx.generate(ctx, prompt, max_tokens=16)
    assert len({adapted, halved, plain}) == 3  # the adapter and its scale change the text
    # One sequence, as the context: a decode of several sequences rounds differently, and this
    # adapter at 0.5 leaves a near-tie in the reply.
    for scale, expected in ((1.0, adapted), (0.5, halved)):
        with llamactx.Engine(model, n_ctx=512, n_seq_max=1, lora_adapter=adapter, lora_scale=scale) as engine:
            assert [engine.submit(prompt, max_tokens=16).result().text for _ in range(2)] == [expected, expected]


def test_requests_at_different_scales_run_at_once_each_as_a_context_at_its_scale(
    model: llamactx.LlamaModel, lora_path: Path
) -> None:
    adapter = model.lora_adapter_init(lora_path)
    prompt = model.str_to_token(PARIS_PROMPT, True)
    ctx = model.new_context(n_ctx=512)
    expected = []
    for scale in (1.0, 0.5, 0.0):
        ctx.lora_adapter_set(adapter, scale)
        expected.append(llamactx.generate(ctx, prompt, max_tokens=16))
    ctx.lora_adapter_remove(adapter)
    assert llamactx.generate(ctx, prompt, max_tokens=16) == expected[2]  # scale 0 is no adapter
    with llamactx.Engine(model, n_ctx=1536, n_seq_max=3, lora_adapter=adapter, lora_scale=1.0) as engine:
        requests = [engine.submit(prompt, max_tokens=16, lora_scale=scale) for scale in (None, 0.5, 0.0)]
        assert [request.result().text for request in requests] == expected
        # Cells cached under scale 1 are not reused at scale 0.5.
        again = engine.submit(prompt, max_tokens=16, lora_scale=0.5).result()
        assert (again.text, again.cached_tokens) == (expected[1], len(prompt) - 1)
        engine.lora_scale = 0.0
        assert engine.submit(prompt, max_tokens=16).result().text == expected[2]
        with pytest.raises(ValueError, match="finite"):
            engine.submit(prompt, lora_scale=math.inf)
    with llamactx.Engine(model, n_ctx=256, n_seq_max=1) as plain, pytest.raises(ValueError, match="no LoRA adapter"):
        plain.submit(prompt, lora_scale=0.5)


def test_a_scale_that_is_not_finite_is_refused(model: llamactx.LlamaModel, lora_path: Path) -> None:
    adapter = model.lora_adapter_init(lora_path)
    with pytest.raises(ValueError, match="scale must be finite"):
        llamactx.Engine(model, n_ctx=256, n_seq_max=1, lora_adapter=adapter, lora_scale=math.nan)
