"""Encode, the run-time switches and the context's settings, on SmolLM2 and a tiny BERT."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from support.decoding import decode_prompt
from support.prompts import PARIS_PROMPT

import llamactx


def test_encode_on_an_encoder_model_gives_mean_pooled_embeddings(tiny_bert_path: Path) -> None:
    model = llamactx.LlamaModel.load_from_file(tiny_bert_path)
    with model.new_context(n_ctx=128, embeddings=True) as ctx:
        assert ctx.pooling_type() == llamactx.LlamaPoolingType.MEAN
        assert isinstance(ctx.pooling_type(), llamactx.LlamaPoolingType)
        tokens = model.str_to_token("the cat sat on the mat")
        batch = llamactx.LlamaBatch(len(tokens))
        batch.add_sequence(tokens, 0, True)
        ctx.encode(batch)
        encoded = ctx.embeddings_seq_ith(0)
        assert encoded.shape == (model.n_embd(),)
        assert np.all(np.isfinite(encoded))
        ctx.decode(batch)  # llama.cpp routes decode to encode for models without a KV cache
        np.testing.assert_allclose(ctx.embeddings_seq_ith(0), encoded, rtol=1e-6, atol=1e-6)


def test_encode_refuses_a_decoder_only_model(ctx: llamactx.LlamaContext, model: llamactx.LlamaModel) -> None:
    batch = llamactx.LlamaBatch(4)
    batch.add_sequence(model.str_to_token("hi", False), 0, True)
    with pytest.raises(ValueError, match="decoder-only"):
        ctx.encode(batch)


def test_encode_error_for_an_empty_batch(tiny_bert_path: Path) -> None:
    model = llamactx.LlamaModel.load_from_file(tiny_bert_path)
    with model.new_context(n_ctx=128, embeddings=True) as ctx, pytest.raises(llamactx.EncodeError) as raised:
        ctx.encode(llamactx.LlamaBatch(1))
    assert raised.value.kind == "NTokensZero"


def test_encoder_model_has_no_kv_cache(tiny_bert_path: Path) -> None:
    model = llamactx.LlamaModel.load_from_file(tiny_bert_path)
    with model.new_context(n_ctx=128, embeddings=True) as ctx:
        assert not ctx.memory_can_shift()
        ctx.clear_kv_cache()  # nothing to clear, and no crash
        with pytest.raises(ValueError, match="no KV cache"):
            ctx.kv_cache_seq_pos_max(0)


@pytest.mark.whole_machine  # sets two threads
def test_set_n_threads(ctx: llamactx.LlamaContext) -> None:
    ctx.set_n_threads(1, 2)
    assert (ctx.n_threads(), ctx.n_threads_batch()) == (1, 2)
    cpus = len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match=rf"n_threads must be in 1\.\.={cpus} "):
        ctx.set_n_threads(0, 1)
    with pytest.raises(ValueError, match=rf"n_threads_batch must be in 1\.\.={cpus} "):
        ctx.set_n_threads(1, cpus + 1)  # ggml threads spin: more than the CPUs ran 100x slower
    assert (ctx.n_threads(), ctx.n_threads_batch()) == (1, 2)


def test_warmup_and_synchronize_keep_results(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    decode_prompt(ctx, tokens)
    expected = ctx.get_logits_ith(-1)
    ctx.synchronize()
    ctx.set_warmup(True)
    ctx.set_warmup(False)
    ctx.clear_kv_cache()
    decode_prompt(ctx, tokens)
    np.testing.assert_array_equal(ctx.get_logits_ith(-1), expected)


def test_causal_attention_switch_changes_logits_and_batch_limit(model: llamactx.LlamaModel) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    with model.new_context(n_ctx=256, n_batch=64, n_ubatch=4) as ctx:
        decode_prompt(ctx, tokens)
        causal = ctx.get_logits_ith(-1)
        ctx.clear_kv_cache()
        ctx.set_causal_attn(False)
        with pytest.raises(ValueError, match="n_ubatch"):
            decode_prompt(ctx, tokens)  # 5 tokens > n_ubatch: llama.cpp would assert
        decode_prompt(ctx, tokens[:4])
        ctx.clear_kv_cache()
        ctx.set_causal_attn(True)
        decode_prompt(ctx, tokens)
        np.testing.assert_array_equal(ctx.get_logits_ith(-1), causal)


def test_set_embeddings_turns_token_embeddings_on(model: llamactx.LlamaModel) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    with model.new_context(n_ctx=256) as ctx:
        decode_prompt(ctx, tokens)
        with pytest.raises(llamactx.EmbeddingsError) as raised:
            ctx.embeddings_ith(-1)
        assert raised.value.kind == "NotEnabled"
        ctx.set_embeddings(True)
        ctx.clear_kv_cache()
        decode_prompt(ctx, tokens)
        assert ctx.embeddings_ith(-1).shape == (model.n_embd(),)
