"""The high-level layer on SmolLM2: streaming, batched generation, embeddings, chat."""

from __future__ import annotations

import numpy as np
import pytest
from support.prompts import HELPFUL, PARIS_PROMPT

import llamactx

MULTIBYTE = "日本語 🙂 café"


def test_greedy_generate_continues_with_paris(ctx: llamactx.LlamaContext) -> None:
    assert llamactx.generate(ctx, PARIS_PROMPT, max_tokens=4).startswith(" Paris")


def test_stream_never_splits_a_character(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext) -> None:
    # Some tokens of this text are parts of a character: alone their bytes are not UTF-8.
    pieces = [model.token_to_bytes(t) for t in model.str_to_token(MULTIBYTE, False)]
    assert any(_not_utf8(piece) for piece in pieces)
    grammar = llamactx.LlamaSampler.grammar(model, f'root ::= "{MULTIBYTE}"')
    sampler = llamactx.LlamaSampler.chain([grammar, llamactx.LlamaSampler.greedy()])
    streamed = list(llamactx.stream(ctx, "Write something:", max_tokens=40, sampler=sampler))
    assert "".join(streamed) == MULTIBYTE
    assert not any("\ufffd" in piece for piece in streamed)


def test_generate_batch_equals_one_prompt_at_a_time(model: llamactx.LlamaModel) -> None:
    prompts = [f"Question {n}: what is {n} plus {n}? Answer:" for n in range(8)]
    with model.new_context(n_ctx=2048, n_seq_max=8) as ctx:
        batched = llamactx.generate_batch(ctx, prompts, max_tokens=24)
        alone = [llamactx.generate(ctx, prompt, max_tokens=24) for prompt in prompts]
    assert batched == alone
    assert len(set(batched)) > 1


def test_shared_prefix_and_groups(model: llamactx.LlamaModel) -> None:
    prefix = "You are a helpful assistant. Answer in one short sentence. "
    prompts = [prefix + question for question in ("What is water?", "What is fire?", "What is air?")]
    with model.new_context(n_ctx=1024, n_seq_max=2) as ctx:  # 3 prompts: two groups
        batched = llamactx.generate_batch(ctx, prompts, max_tokens=16)
        alone = [llamactx.generate(ctx, prompt, max_tokens=16) for prompt in prompts]
    assert batched == alone


def test_generate_batch_stops_and_limits(model: llamactx.LlamaModel) -> None:
    with model.new_context(n_ctx=1024, n_seq_max=4) as ctx:
        full = llamactx.generate_batch(ctx, [PARIS_PROMPT, "One, two,"], max_tokens=20)
        stopped = llamactx.generate_batch(ctx, [PARIS_PROMPT, "One, two,"], max_tokens=20, stop=["."])
        assert stopped == [text.split(".")[0] for text in full]
        assert llamactx.generate_batch(ctx, [PARIS_PROMPT], max_tokens=0) == [""]
        sampler = llamactx.LlamaSampler.chain([llamactx.LlamaSampler.temp(0.8), llamactx.LlamaSampler.dist(7)])
        first = llamactx.generate_batch(ctx, [PARIS_PROMPT] * 2, max_tokens=8, sampler=sampler)
        again = llamactx.generate_batch(ctx, [PARIS_PROMPT] * 2, max_tokens=8, sampler=sampler)
        assert first == again  # each sequence samples with its own copy, seeded alike
        with pytest.raises(ValueError, match="max_tokens"):
            llamactx.generate_batch(ctx, [PARIS_PROMPT], max_tokens=-1)


@pytest.fixture(scope="module")
def embedder(model: llamactx.LlamaModel) -> llamactx.LlamaContext:
    return model.new_context(
        n_ctx=4096,
        n_seq_max=16,
        n_batch=512,
        n_ubatch=512,
        embeddings=True,
        pooling_type=llamactx.LlamaPoolingType.MEAN,
    )


def test_embed_many_equals_one_by_one(embedder: llamactx.LlamaContext, model: llamactx.LlamaModel) -> None:
    texts = [f"Sentence {n}: {'cats' if n % 2 else 'dogs'} like {n} toys." for n in range(16)]
    together = llamactx.embed(embedder, texts)
    assert together.shape == (16, model.n_embd())
    assert together.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, rtol=1e-5)
    one_by_one = np.stack([llamactx.embed(embedder, [text])[0] for text in texts])
    np.testing.assert_allclose(together, one_by_one, atol=1e-4)


def test_embed_takes_token_ids_as_they_are(embedder: llamactx.LlamaContext, model: llamactx.LlamaModel) -> None:
    texts = ["The cat sat on the mat.", "Stocks fell."]
    ids = [model.str_to_token(text, True) for text in texts]
    np.testing.assert_allclose(llamactx.embed(embedder, ids), llamactx.embed(embedder, texts), atol=1e-5)
    mixed = llamactx.embed(embedder, [texts[0], ids[1]])
    np.testing.assert_allclose(mixed, llamactx.embed(embedder, texts), atol=1e-5)
    with pytest.raises(ValueError, match=f"token id {model.n_vocab()} is outside the vocabulary"):
        llamactx.embed(embedder, [[1, model.n_vocab()]])
    with pytest.raises(ValueError, match="has no tokens"):
        llamactx.embed(embedder, [[]])


def test_embeddings_of_paraphrases_are_closer(embedder: llamactx.LlamaContext) -> None:
    a, b, c = llamactx.embed(embedder, ["The cat sat on the mat.", "A cat was sitting on the mat.", "Stocks fell."])
    assert a @ b > a @ c
    assert a @ b > b @ c


def test_embed_without_pooling_averages_tokens(model: llamactx.LlamaModel) -> None:
    with (
        model.new_context(n_ctx=512, embeddings=True, pooling_type=llamactx.LlamaPoolingType.NONE) as ctx,
        model.new_context(n_ctx=512, embeddings=True, pooling_type=llamactx.LlamaPoolingType.MEAN) as mean,
    ):
        np.testing.assert_allclose(
            llamactx.embed(ctx, ["hello world"]), llamactx.embed(mean, ["hello world"]), atol=1e-4
        )
        with pytest.raises(ValueError, match="n_ubatch"):
            llamactx.embed(ctx, ["word " * 1000])


def test_chat_uses_the_template(ctx: llamactx.LlamaContext) -> None:
    messages = [{"role": "system", "content": HELPFUL}, {"role": "user", "content": "What is the capital of France?"}]
    assert "Paris" in llamactx.chat(ctx, messages, max_tokens=20)


def test_chat_session_keeps_history_in_the_cache(ctx: llamactx.LlamaContext) -> None:
    session = llamactx.ChatSession(ctx, system=HELPFUL, max_tokens=20)
    first = "".join(session.send("What is the capital of France?"))
    assert "Paris" in first
    history_tokens = ctx.kv_cache_seq_pos_max(0) + 1
    second = "".join(session.send("And the capital of Italy?"))
    assert "Rome" in second
    assert ctx.kv_cache_seq_pos_max(0) + 1 > history_tokens
    assert session.messages[-1] == ("assistant", second)


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return True
    return False


def test_stream_reports_prompt_progress(model: llamactx.LlamaModel) -> None:
    with model.new_context(n_ctx=1024, n_batch=64) as ctx:
        calls: list[tuple[int, int]] = []
        prompt = "count: " + " ".join(str(n) for n in range(100))
        total = len(model.str_to_token(prompt, model.add_bos_token()))
        pieces = llamactx.stream(ctx, prompt, max_tokens=1, progress=lambda done, n: calls.append((done, n)))
        "".join(pieces)
    assert calls[-1] == (total, total)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert len(calls) == -(-total // 64)


def test_a_sequence_outside_the_context_is_refused_before_any_step(model: llamactx.LlamaModel) -> None:
    with model.new_context(n_ctx=256, n_seq_max=1) as ctx:
        for seq_id in (1, -1, 2**31 - 1):
            with pytest.raises(ValueError, match=f"sequence id {seq_id} is out of range"):
                llamactx.generate(ctx, PARIS_PROMPT, max_tokens=4, seq_id=seq_id)
            history = model.str_to_token(PARIS_PROMPT, model.add_bos_token())
            ctx.clear_kv_cache()
            llamactx.prefill(ctx, history, 0)
            greedy = llamactx.LlamaSampler.greedy()
            pieces = llamactx.continue_sequence(ctx, history, max_tokens=4, sampler=greedy, seq_id=seq_id)
            with pytest.raises(ValueError, match=f"seq_id {seq_id} is outside"):
                next(pieces)
        assert llamactx.generate(ctx, PARIS_PROMPT, max_tokens=4, seq_id=0)
