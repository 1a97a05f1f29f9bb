"""LoRA adapters and control vectors on SmolLM2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.decoding import decode_prompt
from support.prompts import PARIS_PROMPT

import llamactx


def last_logits(ctx: llamactx.LlamaContext, model: llamactx.LlamaModel) -> np.ndarray:
    ctx.clear_kv_cache()
    decode_prompt(ctx, model.str_to_token(PARIS_PROMPT, False))
    return ctx.get_logits_ith(-1)


def test_lora_scale_zero_keeps_and_scale_one_moves_logits(
    model: llamactx.LlamaModel, ctx: llamactx.LlamaContext, lora_path: Path
) -> None:
    base = last_logits(ctx, model)
    adapter = model.lora_adapter_init(lora_path)
    ctx.lora_adapter_set(adapter, 0.0)
    assert adapter.in_use
    np.testing.assert_array_equal(last_logits(ctx, model), base)
    ctx.lora_adapter_set(adapter, 1.0)
    moved = np.abs(last_logits(ctx, model) - base).max()
    assert 0.1 < moved < 100
    ctx.lora_adapter_remove(adapter)
    assert not adapter.in_use
    np.testing.assert_array_equal(last_logits(ctx, model), base)


def test_adapter_lifetime_rules(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext, lora_path: Path) -> None:
    adapter = model.lora_adapter_init(lora_path)
    other = model.lora_adapter_init(lora_path)
    ctx.lora_adapter_set(adapter, 1.0)
    with pytest.raises(ValueError, match="remove the adapter"):
        adapter.close()
    with pytest.raises(ValueError, match="not set"):
        ctx.lora_adapter_remove(other)
    ctx.lora_adapter_set(other, 1.0)  # replaces the first, as the crate does
    assert not adapter.in_use
    adapter.close()
    assert adapter.closed
    with pytest.raises(ValueError, match="closed"):
        ctx.lora_adapter_set(adapter, 1.0)
    ctx.close()
    assert not other.in_use  # a closed context releases its adapter
    other.close()


def test_adapter_of_another_model_is_refused(model_path: Path, ctx: llamactx.LlamaContext, lora_path: Path) -> None:
    second = llamactx.LlamaModel.load_from_file(model_path)
    adapter = second.lora_adapter_init(lora_path)
    with pytest.raises(ValueError, match="another model"):
        ctx.lora_adapter_set(adapter, 1.0)


def test_adapter_outlives_its_python_model(model_path: Path, lora_path: Path) -> None:
    model = llamactx.LlamaModel.load_from_file(model_path)
    adapter = model.lora_adapter_init(lora_path)
    ctx = model.new_context(n_ctx=256)
    model.close()
    del model
    ctx.lora_adapter_set(adapter, 1.0)
    ctx.close()
    del ctx
    adapter.close()  # freed before the native model, which it kept alive


def test_lora_init_errors(model: llamactx.LlamaModel, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        model.lora_adapter_init(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"junk")
    with pytest.raises(llamactx.LlamaLoraAdapterInitError) as raised:
        model.lora_adapter_init(junk)
    assert raised.value.kind == "NullResult"


def test_control_vector_changes_logits_and_clearing_restores_them(
    model: llamactx.LlamaModel, ctx: llamactx.LlamaContext
) -> None:
    base = last_logits(ctx, model)
    n_layer, n_embd = model.n_layer(), model.n_embd()
    vector = np.random.default_rng(0).standard_normal((n_layer - 1, n_embd)).astype(np.float32) * 0.5
    ctx.set_adapter_cvec(vector, n_embd, 1, n_layer - 1)
    assert np.abs(last_logits(ctx, model) - base).max() > 0.1
    ctx.set_adapter_cvec(None, n_embd, 1, n_layer - 1)
    np.testing.assert_array_equal(last_logits(ctx, model), base)
    ctx.set_adapter_cvec(vector.ravel().tolist(), n_embd, 1, n_layer - 1)  # any array-like
    assert np.abs(last_logits(ctx, model) - base).max() > 0.1
    ctx.set_adapter_cvec([], n_embd, 1, n_layer - 1)  # empty clears too
    np.testing.assert_array_equal(last_logits(ctx, model), base)
    with pytest.raises(ValueError, match="n_embd"):
        ctx.set_adapter_cvec(vector, n_embd + 1, 1, n_layer - 1)
