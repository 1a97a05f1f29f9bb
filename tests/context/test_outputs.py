"""Candidates, embeddings and backend-sampled outputs on SmolLM2."""

from __future__ import annotations

import numpy as np
import pytest
from support.decoding import decode_prompt
from support.prompts import PARIS_PROMPT

import llamactx


@pytest.fixture
def decoded(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext) -> llamactx.LlamaContext:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    batch = llamactx.LlamaBatch(len(tokens))
    batch.add_sequence(tokens, 0, True)
    ctx.decode(batch)
    return ctx


def test_candidates_mirror_the_logits(model: llamactx.LlamaModel, decoded: llamactx.LlamaContext, paris: int) -> None:
    candidates = decoded.candidates_ith(-1)
    assert len(candidates) == model.n_vocab()
    np.testing.assert_array_equal(candidates.ids, np.arange(model.n_vocab(), dtype=np.int32))
    np.testing.assert_array_equal(candidates.logits, decoded.get_logits_ith(-1))
    assert candidates.ids.dtype == np.int32
    assert not candidates.p.any()
    item = candidates[paris]
    assert (item.id, item.logit) == (paris, float(decoded.get_logits_ith(-1)[paris]))
    assert candidates[-1].id == model.n_vocab() - 1
    with pytest.raises(IndexError):
        candidates[model.n_vocab()]
    assert sum(1 for _ in decoded.candidates()) == model.n_vocab()
    np.testing.assert_array_equal(decoded.token_data_array().logits, decoded.get_logits())
    np.testing.assert_array_equal(decoded.candidates().logits, decoded.get_logits_ith(0))


def test_samplers_applied_to_candidates(decoded: llamactx.LlamaContext, paris: int) -> None:
    candidates = decoded.candidates_ith(-1)
    assert candidates.selected is None
    llamactx.LlamaSampler.top_k(5).apply(candidates)
    assert len(candidates) == 5
    assert candidates.sorted
    llamactx.LlamaSampler.dist(0).apply(candidates)  # computes probabilities, then picks
    assert candidates.p.sum() == pytest.approx(1.0, abs=1e-5)
    llamactx.LlamaSampler.greedy().apply(candidates)
    assert candidates.selected_token() == paris


def test_mean_pooled_embeddings_of_paraphrases_are_closer(model: llamactx.LlamaModel) -> None:
    texts = ["The cat sat on the mat.", "A cat was sitting on the mat.", "Stock markets fell sharply today."]
    with model.new_context(
        n_ctx=512, n_batch=510, n_ubatch=510, n_seq_max=3, embeddings=True, pooling_type=llamactx.LlamaPoolingType.MEAN
    ) as ctx:
        batch = llamactx.LlamaBatch(64, 1)
        for seq, text in enumerate(texts):
            for pos, token in enumerate(model.str_to_token(text, False)):
                batch.add(token, pos, [seq], True)
        ctx.decode(batch)
        vectors = [ctx.embeddings_seq_ith(seq) for seq in range(3)]
        with pytest.raises(llamactx.EmbeddingsError):
            ctx.get_embeddings()  # pooled contexts have no token embeddings

    def cosine(a: np.ndarray, b: np.ndarray) -> float:
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[1], vectors[2])


def test_token_embeddings_without_pooling(model: llamactx.LlamaModel) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    with model.new_context(n_ctx=256, embeddings=True, pooling_type=llamactx.LlamaPoolingType.NONE) as ctx:
        batch = llamactx.LlamaBatch(len(tokens))
        batch.add_sequence(tokens, 0, True)
        ctx.decode(batch)
        matrix = ctx.get_embeddings()
        assert matrix.shape == (len(tokens), model.n_embd())
        assert matrix.dtype == np.float32
        np.testing.assert_array_equal(matrix[2], ctx.embeddings_ith(2))
        np.testing.assert_array_equal(matrix[-1], ctx.embeddings_ith(-1))
        with pytest.raises(llamactx.EmbeddingsError) as raised:
            ctx.embeddings_seq_ith(0)
        assert raised.value.kind == "NonePoolType"
        with pytest.raises(llamactx.EmbeddingsError):
            ctx.embeddings_ith(len(tokens))


def test_embeddings_error_when_disabled(decoded: llamactx.LlamaContext) -> None:
    with pytest.raises(llamactx.EmbeddingsError) as raised:
        decoded.get_embeddings()
    assert raised.value.kind == "NotEnabled"


def test_backend_sampler_results(model: llamactx.LlamaModel, paris: int) -> None:
    with model.new_context(n_ctx=256) as ctx:
        with pytest.raises(IndexError, match="no backend sampler"):
            ctx.get_sampled_token_ith(-1)
        sampler = llamactx.LlamaSampler.chain([llamactx.LlamaSampler.top_k(10), llamactx.LlamaSampler.greedy()])
        assert ctx.set_sampler(0, sampler) is True
        decode_prompt(ctx, model.str_to_token(PARIS_PROMPT, False))
        assert ctx.get_sampled_token_ith(-1) == paris
        candidates = ctx.get_sampled_candidates_ith(-1)
        assert candidates.dtype == np.int32
        assert paris in candidates.tolist()
        logits = ctx.get_sampled_logits_ith(-1)
        assert len(logits) == ctx.get_sampled_logits_count_ith(-1)
        probs = ctx.get_sampled_probs_ith(-1)
        assert len(probs) == ctx.get_sampled_probs_count_ith(-1)
        with pytest.raises(IndexError, match="backend sampler"):
            ctx.get_logits_ith(-1)  # llama.cpp keeps no full rows for backend-sampled sequences
        assert ctx.set_sampler(0, None) is True
        ctx.clear_kv_cache()
        decode_prompt(ctx, model.str_to_token(PARIS_PROMPT, False))
        assert int(np.argmax(ctx.get_logits_ith(-1))) == paris
