"""LlamaModel on SmolLM2: loading, tokenizer, metadata, chat template."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
from support.prompts import PARIS_PROMPT

import llamactx


def test_tokenization_round_trip(model: llamactx.LlamaModel) -> None:
    text = "Hello, world! Ça va? 日本語 🙂"
    tokens = model.str_to_token(text, False)
    assert all(isinstance(t, int) for t in tokens)
    assert model.detokenize(tokens) == text
    assert b"".join(model.token_to_bytes(t) for t in tokens).decode() == text


def test_known_tokens_of_the_paris_prompt(model: llamactx.LlamaModel) -> None:
    assert model.str_to_token(PARIS_PROMPT, False) == [504, 3575, 282, 4649, 314]
    assert model.token_to_str(4649) == " France"


def test_add_bos_follows_the_tokenizer_configuration(model: llamactx.LlamaModel) -> None:
    # SmolLM2's tokenizer is configured not to add BOS, and llama.cpp honours that.
    assert model.add_bos_token() is False
    assert model.str_to_token("hi", True) == model.str_to_token("hi", False)
    assert model.token_bos() == 1


def test_special_tokens_are_parsed_unless_disabled(model: llamactx.LlamaModel) -> None:
    parsed = model.str_to_token("<|im_start|>", False)
    assert len(parsed) == 1
    assert model.token_to_str(parsed[0], True) == "<|im_start|>"
    assert model.token_to_str(parsed[0], False) == ""
    assert len(model.str_to_token("<|im_start|>", False, special=False)) > 1


def test_vocabulary_and_shape_getters(model: llamactx.LlamaModel) -> None:
    assert model.n_vocab() == 49152
    assert model.n_embd() == 576
    assert model.n_layer() == 30
    assert model.n_ctx_train() == 8192
    assert model.n_params() > 100_000_000
    assert model.is_eog_token(model.token_eos())
    assert not model.is_eog_token(model.str_to_token("a", False)[0])


def test_tokens_accept_numpy_arrays(model: llamactx.LlamaModel) -> None:
    tokens = model.str_to_token(PARIS_PROMPT, False)
    assert model.detokenize(np.array(tokens, dtype=np.int64)) == PARIS_PROMPT
    with pytest.raises(TypeError):
        model.detokenize(np.array(tokens, dtype=np.float32))
    with pytest.raises(TypeError):
        model.detokenize("not tokens")


def test_metadata(model: llamactx.LlamaModel) -> None:
    metadata = model.metadata()
    assert metadata["general.architecture"] == "llama"
    assert model.meta_val_str("general.architecture") == "llama"
    assert model.meta_count() == len(metadata)
    assert "llama" in model.desc()
    with pytest.raises(llamactx.StringFromModelError) as raised:
        model.meta_val_str("no.such.key")
    assert raised.value.kind == "ReturnedError"
    assert raised.value.code == -1


def test_chat_template(model: llamactx.LlamaModel) -> None:
    assert "im_start" in model.get_chat_template()
    prompt = model.apply_chat_template([("user", "hi")])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    as_dicts = model.apply_chat_template([{"role": "user", "content": "hi"}], add_ass=False)
    assert as_dicts == "<|im_start|>user\nhi<|im_end|>\n"


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        llamactx.LlamaModel.load_from_file(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="NUL"):
        llamactx.LlamaModel.load_from_file("bad\0path.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(llamactx.LlamaModelLoadError) as raised:
        llamactx.LlamaModel.load_from_file(junk)
    assert raised.value.kind == "NullResult"


def test_vocab_only_model_tokenizes(model_path: Path, model: llamactx.LlamaModel) -> None:
    vocab = llamactx.LlamaModel.load_from_file(model_path, vocab_only=True)
    assert vocab.str_to_token(PARIS_PROMPT, False) == model.str_to_token(PARIS_PROMPT, False)


def test_closed_model_raises_value_error(model_path: Path) -> None:
    with llamactx.LlamaModel.load_from_file(model_path, vocab_only=True) as vocab:
        assert not vocab.closed
    assert vocab.closed
    with pytest.raises(ValueError, match="closed"):
        vocab.n_vocab()
    del vocab
    gc.collect()
