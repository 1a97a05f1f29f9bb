"""The exception hierarchy, and each mapped crate error raised by a real call."""

from __future__ import annotations

import pytest
from support.prompts import PARIS_PROMPT

import llamactx
from llamactx import _llamactx

# Every class the native module registers (its one list is in crates/llamactx-engine/src/errors.rs).
CRATE_ERRORS = sorted(
    name
    for name, value in vars(_llamactx).items()
    if isinstance(value, type) and issubclass(value, llamactx.LlamaCppError)
)


@pytest.mark.parametrize("name", CRATE_ERRORS)
def test_every_error_derives_from_llama_cpp_error(name: str) -> None:
    cls = getattr(llamactx, name)
    assert issubclass(cls, llamactx.LlamaCppError)
    assert cls.__module__ == "llamactx"
    assert cls.__doc__


def test_special_bases() -> None:
    assert issubclass(llamactx.LlamaCppError, Exception)
    assert issubclass(llamactx.KvCacheConversionError, OverflowError)
    assert issubclass(llamactx.DecodeAborted, llamactx.DecodeError)


def test_decode_error_of_an_empty_batch(ctx: llamactx.LlamaContext) -> None:
    with pytest.raises(llamactx.DecodeError) as raised:
        ctx.decode(llamactx.LlamaBatch(1))
    assert raised.value.kind == "NTokensZero"
    assert raised.value.code == -1


def test_decode_error_when_the_cache_is_full(model: llamactx.LlamaModel) -> None:
    with model.new_context(n_ctx=256, n_batch=256) as ctx:
        batch = llamactx.LlamaBatch(256)
        batch.add_sequence([model.token_bos()] * 256, 0, False)
        ctx.decode(batch)
        batch.clear()
        batch.add(model.token_bos(), 256, [0], True)
        with pytest.raises(llamactx.DecodeError) as raised:
            ctx.decode(batch)
    assert raised.value.kind == "NoKvCacheSlot"
    assert raised.value.code == 1


def test_batch_add_error_when_full() -> None:
    batch = llamactx.LlamaBatch(1)
    batch.add(1, 0, [0], True)
    with pytest.raises(llamactx.BatchAddError) as raised:
        batch.add(1, 1, [0], True)
    assert raised.value.kind == "InsufficientSpace"
    with pytest.raises(llamactx.BatchAddError):
        batch.add_sequence([1, 2], 0, False)
    assert len(batch) == 1


def test_kv_cache_conversion_error_is_an_overflow_error(ctx: llamactx.LlamaContext) -> None:
    with pytest.raises(llamactx.KvCacheConversionError) as raised:
        ctx.kv_cache_seq_add(0, 2**31, None, 1)
    assert raised.value.kind == "P0TooLarge"
    with pytest.raises(OverflowError):
        ctx.clear_kv_cache_seq(0, 0, 2**40)


def test_tokenizer_errors(model: llamactx.LlamaModel) -> None:
    with pytest.raises(llamactx.StringToTokenError) as raised:
        model.str_to_token("a\0b")
    assert raised.value.kind == "InteriorNul"
    lone_byte = next(t for t in range(model.n_vocab()) if not _is_utf8(model.token_to_bytes(t)))
    with pytest.raises(llamactx.TokenToStringError) as raised_text:
        model.token_to_str(lone_byte)
    assert raised_text.value.kind == "FromUtf8Error"


def test_chat_errors(model: llamactx.LlamaModel) -> None:
    with pytest.raises(llamactx.NewLlamaChatMessageError):
        model.apply_chat_template([("user", "a\0b")])
    with pytest.raises(llamactx.ApplyChatTemplateError):
        model.apply_chat_template([("user", "hi")], tmpl="{{ not a template llama.cpp knows }}")


def test_model_load_error_has_kind(tmp_path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(llamactx.LlamaModelLoadError) as raised:
        llamactx.LlamaModel.load_from_file(empty)
    assert raised.value.kind == "NullResult"
    assert raised.value.code is None


def test_errors_carry_messages(model: llamactx.LlamaModel) -> None:
    with pytest.raises(llamactx.StringFromModelError, match="error code -1"):
        model.meta_val_str("missing" + PARIS_PROMPT)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_context_load_error_when_llama_cpp_refuses(model: llamactx.LlamaModel) -> None:
    with pytest.raises(llamactx.LlamaContextLoadError) as raised:
        model.new_context(n_seq_max=1000)  # llama.cpp allows at most 256 sequences
    assert raised.value.kind == "NullReturn"
