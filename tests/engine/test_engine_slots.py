"""An engine's cached slots saved and restored (``save_slots``, ``restore_slot``, ``erase_slot``)
and kept on disk (``save_prompt_cache``, ``load_prompt_cache``): a restored slot is reused by
the prefix cache with the reply it gave before, slot files are llama.cpp's sequence state files
both ways, and files of another model, setting or content are refused without harm."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import llamactx

#: A long shared start (about 150 tokens) and a question after it.
SYSTEM = "You are a patient guide to the history of European cities. " * 12
PROMPT = SYSTEM + "Question: which city is the capital of France? Answer:"


def engine_of(model: llamactx.LlamaModel, **options: object) -> llamactx.Engine:
    return llamactx.Engine(model, n_ctx=1024, n_seq_max=2, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def first(model: llamactx.LlamaModel) -> Iterator[tuple[llamactx.Completion, list[bytes]]]:
    """A reply to ``PROMPT`` on a fresh engine, and its saved slots."""
    with engine_of(model) as engine:
        completion = engine.submit(PROMPT, max_tokens=8).result()
        yield completion, engine.save_slots()


def test_a_restored_slot_is_reused_and_gives_the_same_reply(
    model: llamactx.LlamaModel, first: tuple[llamactx.Completion, list[bytes]]
) -> None:
    completion, files = first
    assert len(files) == 1
    with engine_of(model) as engine:
        seq, count = engine.restore_slot(files[0])
        prompt = engine.tokens(PROMPT)
        # The prompt and the reply but its last token, which was never decoded.
        assert (seq, count) == (0, len(prompt) + completion.completion_tokens - 1)
        assert engine.stats().kv_cells_cached == count
        again = engine.submit(PROMPT, max_tokens=8).result()
        assert again.text == completion.text
        assert again.cached_tokens == len(prompt) - 1
        assert engine.stats().prompt_tokens_computed == 1
        assert engine.erase_slot(seq) == len(prompt) + again.completion_tokens - 1
        assert engine.stats().kv_cells_cached == 0


def test_slot_files_are_llama_cpps_sequence_state_files_both_ways(
    model: llamactx.LlamaModel, first: tuple[llamactx.Completion, list[bytes]], tmp_path: Path
) -> None:
    completion, files = first
    prompt = model.str_to_token(PROMPT, model.add_bos_token())
    # The engine's file read by llama.cpp's own format (LlamaContext.state_seq_load_file): the
    # cells are those a context computes decoding as the engine did (the prompt at once, then a
    # token at a time), so the next token gets the same logits. A sequence's state records the
    # KV streams (here one per sequence): the context has as many.
    engine_file = tmp_path / "engine.bin"
    engine_file.write_bytes(files[0])
    restored = model.new_context(n_ctx=1024, n_seq_max=2)
    held = restored.state_seq_load_file(engine_file, 0, 1024)
    assert held[: len(prompt)] == prompt
    fresh = model.new_context(n_ctx=1024, n_seq_max=2)
    llamactx.prefill(fresh, prompt, 0)
    for position in range(len(prompt), len(held) + 1):
        token = held[position] if position < len(held) else model.token_nl()
        for ctx in (fresh, restored) if position == len(held) else (fresh,):
            batch = llamactx.LlamaBatch(1)
            batch.add(token, position, [0], True)
            ctx.decode(batch)
    np.testing.assert_allclose(restored.get_logits_ith(-1), fresh.get_logits_ith(-1), atol=1e-4)
    # A file llama.cpp wrote (llama_state_seq_save_file) restored into an engine; one whose
    # tokens are not its cells' (one short) is refused.
    written = tmp_path / "llama.bin"
    fresh.state_seq_save_file(written, 0, held)
    with engine_of(model) as engine, pytest.raises(llamactx.StateError, match="not those of its"):
        engine.restore_slot(written.read_bytes())
    fresh.state_seq_save_file(written, 0, [*held, model.token_nl()])
    with engine_of(model) as engine:
        assert engine.restore_slot(written.read_bytes()) == (0, len(held) + 1)
        again = engine.submit(PROMPT, max_tokens=8).result()
        assert again.text == completion.text
        assert again.cached_tokens == len(prompt) - 1


def test_files_the_engine_cannot_use_are_refused_and_leave_the_slot_empty(
    model: llamactx.LlamaModel, first: tuple[llamactx.Completion, list[bytes]], tiny_bert_path: Path
) -> None:
    _, files = first
    with engine_of(model) as engine:
        engine.submit(PROMPT, max_tokens=2).result()
        for broken in (b"", b"garbage!" * 4, files[0][: len(files[0]) // 2], files[0] + b"\0"):
            with pytest.raises(llamactx.StateError):
                engine.restore_slot(broken, 0)
            assert engine.stats().kv_cells_cached == 0
        # Cells of another model: a tiny BERT's KV has other layers and widths.
        bert = llamactx.LlamaModel.load_from_file(tiny_bert_path)
        other = bert.new_context(n_ctx=64)
        tokens = bert.str_to_token("the cat sat", True)
        llamactx.prefill(other, tokens, 0)
        foreign = Path(str(tiny_bert_path) + ".state")
        other.state_seq_save_file(foreign, 0, tokens)
        with pytest.raises(llamactx.StateError):
            engine.restore_slot(foreign.read_bytes(), 1)
        foreign.unlink()
        with pytest.raises(IndexError, match="slot 2"):
            engine.save_slots(2)
        # The engine goes on serving.
        assert engine.submit(PROMPT, max_tokens=2).result().completion_tokens == 2
    with pytest.raises(ValueError, match="closed"):
        engine.save_slots()
    without_cache = llamactx.Engine(model, n_ctx=256, n_seq_max=1, prefix_cache=False)
    with without_cache, pytest.raises(ValueError, match="no prefix cache"):
        without_cache.restore_slot(files[0])


def test_the_prompt_cache_outlives_the_engine_and_refuses_another_engines(
    model: llamactx.LlamaModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    with engine_of(model) as engine:
        reply = engine.submit(PROMPT, max_tokens=4).result().text
        engine.submit("An unrelated prompt", max_tokens=4).result()
        assert engine.save_prompt_cache(cache) == 2
    assert len(list(cache.iterdir())) == 2
    with engine_of(model) as engine:
        assert engine.load_prompt_cache(cache) == 2
        again = engine.submit(PROMPT, max_tokens=4).result()
        assert (again.text, again.cached_tokens) == (reply, len(engine.tokens(PROMPT)) - 1)
    # Another KV setting (a quantized K cache) made it: refused, and said why.
    with caplog.at_level(logging.WARNING, logger="llamactx"), engine_of(model, cache_type_k="q8_0") as engine:
        assert engine.load_prompt_cache(cache) == 0
        assert engine.stats().kv_cells_cached == 0
    assert "another model, adapter or KV setting" in caplog.text
    # A byte changed: refused by its hash before llama.cpp reads it.
    victim = max(cache.iterdir(), key=lambda path: path.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="llamactx"), engine_of(model) as engine:
        assert engine.load_prompt_cache(cache) == 1
    assert "not those it was saved with" in caplog.text


def test_the_prompt_cache_keeps_to_its_bytes_newest_first(model: llamactx.LlamaModel, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with engine_of(model) as engine:
        engine.submit(PROMPT, max_tokens=2).result()
        (whole,) = engine.save_slots()
        engine.save_prompt_cache(cache)
        engine.erase_slot(0)
        engine.submit("A short prompt", max_tokens=2).result()
        # Room for the new file only: the older one goes.
        newest = engine.save_prompt_cache(cache, max_bytes=len(whole))
    assert newest == 1
    (kept,) = cache.iterdir()
    assert kept.stat().st_size < len(whole)
    with engine_of(model) as engine:
        assert engine.save_prompt_cache(cache, max_bytes=100) == 0  # nothing fits
