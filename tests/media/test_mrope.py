"""Images on a model that places an image's embeddings on fewer positions than it has (M-RoPE:
Qwen2-VL and its successors), on a tiny random Qwen2-VL and its projector
(``synthetic.write_tiny_qwen2vl``): ``chat``, ``ChatSession`` and ``Engine`` read them with the
engine's step loop, as mtmd's own helper (``MtmdContext.eval_chunks``) does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import synthetic
from support.images import image_message, picture

import llamactx
from llamactx import MediaBudget, MtmdBitmap, MtmdContext

SIZE = synthetic.QWEN2VL_IMAGE_SIZE
SYSTEM = ("system", "You read images.")  # the template adds no system turn of its own then
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def qwen2vl(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[llamactx.LlamaModel, MtmdContext]]:
    folder = tmp_path_factory.mktemp("qwen2vl")
    text, projector = synthetic.write_tiny_qwen2vl(folder / "qwen2vl.gguf", folder / "mmproj.gguf", model_path)
    model = llamactx.LlamaModel.load_from_file(text)
    with MtmdContext(model, projector, n_threads=1) as mtmd:
        yield model, mtmd


def reference_reply(
    model: llamactx.LlamaModel, mtmd: MtmdContext, ctx: llamactx.LlamaContext, question: str, image: object
) -> str:
    """The greedy reply to one image and ``question`` read by mtmd's helper (``eval_chunks``)."""
    rendered = model.apply_chat_template([SYSTEM, ("user", f"<__media__>{question}")], None, True)
    chunks = mtmd.tokenize(rendered, [MtmdBitmap.from_rgb(image)], add_special=model.add_bos_token())
    assert chunks.n_pos() < chunks.n_tokens(), "the image's embeddings share positions"
    ctx.clear_kv_cache()
    history = [0] * mtmd.eval_chunks(ctx, chunks, 0, 0)
    pieces = llamactx.continue_sequence(ctx, history, max_tokens=MAX_TOKENS, sampler=llamactx.LlamaSampler.greedy())
    return "".join(pieces)


def test_the_tiny_qwen2vl_places_an_image_on_fewer_positions_than_embeddings(
    qwen2vl: tuple[llamactx.LlamaModel, MtmdContext],
) -> None:
    model, mtmd = qwen2vl
    assert mtmd.decode_use_mrope()
    chunks = mtmd.tokenize_from_parts([MtmdBitmap.from_rgb(picture(1, SIZE))], add_special=False)
    image = next(chunks[index] for index in range(len(chunks)) if chunks[index].n_pos() != chunks[index].n_tokens())
    assert (image.n_tokens(), image.n_pos()) == (synthetic.QWEN2VL_IMAGE_TOKENS, synthetic.QWEN2VL_IMAGE_POSITIONS)
    assert model.n_embd() == synthetic.QWEN2VL_WIDTH


def test_chat_a_session_and_the_engine_read_an_image_as_mtmd_s_helper_does(
    qwen2vl: tuple[llamactx.LlamaModel, MtmdContext],
) -> None:
    model, mtmd = qwen2vl
    question, image = "What is it?", picture(2, SIZE)
    messages = [SYSTEM, image_message(question, image)]
    with model.new_context(n_ctx=512, n_threads=1, n_threads_batch=1) as ctx:
        expected = reference_reply(model, mtmd, ctx, question, image)
        assert llamactx.chat(ctx, messages, max_tokens=MAX_TOKENS, mtmd=mtmd) == expected
        # Another image, another reply: the image is read, not skipped.
        other = llamactx.chat(
            ctx, [SYSTEM, image_message(question, picture(3, SIZE))], max_tokens=MAX_TOKENS, mtmd=mtmd
        )
        assert other != expected

        session = llamactx.ChatSession(ctx, system=SYSTEM[1], max_tokens=MAX_TOKENS, mtmd=mtmd)
        assert "".join(session.send(messages[1]["content"])) == expected
        encodes = mtmd.n_encodes()
        second = "".join(session.send("And its colours?"))
        assert mtmd.n_encodes() == encodes, "the next turn reuses the image's cells"
        # The sequence ends where its positions say: the image counts its positions, not its embeddings.
        held = session._held
        assert sum(1 for token in held if token < 0) == synthetic.QWEN2VL_IMAGE_POSITIONS
        assert ctx.kv_cache_seq_pos_max(0) == len(held) - 1
        # The text after the reused image stands at the positions it has when read whole.
        whole = llamactx.chat(ctx, session.messages[:-1], max_tokens=MAX_TOKENS, mtmd=mtmd)
        assert whole == second

    with llamactx.Engine(model, mtmd=mtmd, n_ctx=512, n_seq_max=2, n_threads=1, n_threads_batch=1) as engine:
        replies = [engine.submit_chat(messages, max_tokens=MAX_TOKENS) for _ in range(2)]
        assert [reply.result().text for reply in replies] == [expected, expected]


def test_an_image_prompt_is_measured_in_cells_not_positions(qwen2vl: tuple[llamactx.LlamaModel, MtmdContext]) -> None:
    """A 224-pixel image takes 16 cells on 4 positions: a prompt of 32 whose positions fit the
    sequence but whose cells do not is refused at submit, before any image is encoded. (llama.cpp
    rounds n_ctx up to a multiple of 256.)"""
    model, mtmd = qwen2vl
    images = [picture(seed, 224) for seed in range(32)]
    messages = [SYSTEM, image_message("Compare them.", *images)]
    with llamactx.Engine(model, mtmd=mtmd, n_ctx=768, n_seq_max=1, n_threads=1, n_threads_batch=1) as engine:
        prepared = engine.prepare_chat(messages, media_budget=MediaBudget(max_parts=32))
        assert prepared.media is not None
        positions = prepared.n_tokens - sum(c.n_tokens() - c.n_pos() for c in prepared.media.chunks)
        assert positions < 768 <= prepared.n_tokens, (positions, prepared.n_tokens)
        encodes = mtmd.n_encodes()
        refusal = f"the prompt has {prepared.n_tokens} tokens, its images' included; a sequence holds 768 "
        with pytest.raises(ValueError, match=refusal):
            engine.submit_prepared(prepared)
        assert mtmd.n_encodes() == encodes
