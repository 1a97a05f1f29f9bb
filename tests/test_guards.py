"""Inputs that would abort or corrupt llama.cpp if they reached it, each run in a child process
so that a crash fails the test instead of killing pytest."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import raised_in_subprocess

SETUP = "ctx = model.new_context(n_ctx=256, n_batch=8, n_seq_max=2); batch = llamactx.LlamaBatch(16, 2); "

CASES = {
    "token id past the vocabulary, in a decode": (
        SETUP + "batch.add(model.n_vocab(), 0, [0], True); ctx.decode(batch)",
        "ValueError",
    ),
    "negative token id": (SETUP + "batch.add(-1, 0, [0], True)", "ValueError"),
    "sequence id past n_seq_max, in a decode": (
        SETUP + "batch.add(1, 0, [2], True); ctx.decode(batch)",
        "ValueError",
    ),
    "more seq_ids than the batch holds": (SETUP + "batch.add(1, 0, [0, 1, 0], True)", "ValueError"),
    "empty seq_ids": (SETUP + "batch.add(1, 0, [], True)", "ValueError"),
    "more tokens than n_batch": (
        SETUP + "batch.add_sequence(list(range(9)), 0, False); ctx.decode(batch)",
        "ValueError",
    ),
    "token_to_str past the vocabulary": ("model.token_to_str(10**6)", "ValueError"),
    "detokenize a negative id": ("model.detokenize([5, -3])", "ValueError"),
    "is_eog_token past the vocabulary": ("model.is_eog_token(model.n_vocab())", "ValueError"),
    "token id past int32": ("model.detokenize([2**40])", "ValueError"),
    "kv op on a sequence past n_seq_max": (SETUP + "ctx.kv_cache_seq_pos_max(5)", "ValueError"),
    "kv copy into a negative sequence": (SETUP + "ctx.copy_kv_cache_seq(0, -1)", "ValueError"),
    "kv_cache_seq_div by zero": (SETUP + "ctx.kv_cache_seq_div(0, None, None, 0)", "ValueError"),
    "kv_cache_seq_div by 256": (SETUP + "ctx.kv_cache_seq_div(0, None, None, 256)", "ValueError"),
    "sampling before any decode": (SETUP + "llamactx.LlamaSampler.greedy().sample(ctx, 0)", "IndexError"),
    "logits of a row past n_ctx": (
        SETUP + "batch.add(1, 0, [0], True); ctx.decode(batch); ctx.get_logits_ith(10**6)",
        "IndexError",
    ),
    "mean pooling that cannot split micro-batches": (
        "model.new_context(embeddings=True, pooling_type=llamactx.LlamaPoolingType.MEAN, n_seq_max=3)",
        "ValueError",
    ),
    "metadata key with a NUL byte": ("model.meta_val_str('general\\0name')", "ValueError"),
    "huge batch allocation": ("llamactx.LlamaBatch(2**40, 2**10)", "ValueError"),
    "encode on a decoder-only model": (SETUP + "batch.add(1, 0, [0], True); ctx.encode(batch)", "ValueError"),
    "partial copy between per-sequence KV streams": (
        SETUP + "batch.add_sequence([1, 2, 3, 4], 0, False); ctx.decode(batch); ctx.copy_cache(0, 1, 2)",
        "ValueError",
    ),
    "end-of-generation accepted by an unfinished grammar": (
        "llamactx.LlamaSampler.grammar(model, 'root ::= \"a\"').accept(model.token_eos())",
        "ShimError",
    ),
    "grammar accept past the vocabulary": (
        "llamactx.LlamaSampler.grammar(model, 'root ::= \"a\"').accept(model.n_vocab())",
        "ValueError",
    ),
    "a backend sampler that is not a chain": (
        SETUP + "ctx.set_sampler(0, llamactx.LlamaSampler.greedy()); batch.add(1, 0, [0], True); "
        "ctx.decode(batch); assert ctx.get_sampled_token_ith(-1) >= 0",
        "none",
    ),
    "device-only sequence state flag": (SETUP + "ctx.state_seq_get_data_ext(0, 2)", "ValueError"),
    "sequence state past n_seq_max": (SETUP + "ctx.state_seq_get_size(9)", "ValueError"),
    "huge token capacity on load": (SETUP + "ctx.state_load_file(MODEL_PATH, 2**40)", "ValueError"),
    "control vector of the wrong width": (SETUP + "ctx.set_adapter_cvec([1.0] * 10, 7, 1, 2)", "ValueError"),
    "logits after a state restore": (
        SETUP + "batch.add(1, 0, [0], True); ctx.decode(batch); ctx.state_set_data(ctx.state_get_data()); "
        "ctx.get_logits()",
        "IndexError",
    ),
    "zero-sized batch": ("llamactx.LlamaBatch(0)", "ValueError"),
}


@pytest.mark.parametrize(("call", "expected"), list(CASES.values()), ids=list(CASES))
def test_hostile_input_raises_instead_of_crashing(model_path: Path, call: str, expected: str) -> None:
    assert raised_in_subprocess(model_path, call) == expected
