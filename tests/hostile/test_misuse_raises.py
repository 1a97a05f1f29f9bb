"""What the red team of issue 17 found could kill or hang the interpreter now raises a typed
exception (or works): each case runs in a child process with a timeout
(``support/children/misuse_raises.py``), so a crash or a hang fails one test instead of pytest.
The cases of ``RAISES`` run one after another in one child, but those in ``ALONE``; a case whose
outcome there is not the one expected runs again alone, and that run decides."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support import synthetic
from support.processes import raised_alone, raised_one_after_another

import llamactx

RAISES = {
    # 1. Sampling that cannot select a token
    "sampler_without_a_selecting_stage": "ValueError",
    "generate_with_top_k_alone": "ValueError",
    "sampling_pooled_embeddings": "IndexError",
    "logits_of_pooled_embeddings": "IndexError",
    # 2. Grammars
    "grammar_after_top_k_keeps_no_candidate": "ShimError",
    "grammar_reused_after_a_refused_token": "ValueError",
    "grammar_chained_after_a_refused_token": "ValueError",
    "grammar_reset_after_a_refused_token": "none",
    "lazy_grammar_with_an_invalid_pattern": "ValueError",
    "lazy_grammar_with_a_deeply_nested_pattern": "ValueError",
    "lazy_grammar_with_a_valid_pattern": "none",
    "lazy_grammar_waiting_through_a_backtracking_pattern": "none",
    "lazy_grammar_with_a_deeply_nested_look_around": "ValueError",
    "lazy_grammar_waiting_through_a_look_around_pattern_that_backtracks": "ValueError",
    # 3. Parameters llama.cpp asserts on
    "more_sequences_than_batch_rows": "ValueError",
    "mean_pooling_switched_on_later": "ValueError",
    "context_of_a_vocabulary_only_model": "ValueError",
    # 4. Capabilities claimed but absent
    "shifting_a_bf16_k_cache": "ValueError",
    "backend_top_k_beyond_the_candidates": "ValueError",
    "backend_logit_bias_past_an_earlier_top_k": "ValueError",
    "backend_penalties_of_another_vocabulary": "ValueError",
    "backend_logit_bias_after_top_k": "ValueError",
    "backend_stage_after_dist": "ValueError",
    "backend_third_top_k_or_top_p": "ValueError",
    "backend_top_k_after_a_temperature_of_zero": "ValueError",
    "backend_chain_past_its_graph_size": "ValueError",
    "backend_chain_that_fits": "none",
    "backend_chain_ending_in_dist": "none",
    # 5. Sizes taken from user numbers
    "context_larger_than_the_machine": "ValueError",
    "penalty_window_of_a_billion_tokens": "ValueError",
    "dry_window_of_a_billion_tokens": "ValueError",
    "batch_of_a_hundred_million_tokens": "ValueError",
    "state_announcing_a_2_gib_architecture_name": "StateError",
    "state_file_announcing_a_2_gib_architecture_name": "StateError",
    # 6. Re-entrancy and signals
    "abort_callback_calling_its_context": "RuntimeError",
    "abort_callback_calling_its_batch": "RuntimeError",
    "ctrl_c_during_a_decode_nested_in_a_callback": "KeyboardInterrupt",
    "context_used_after_a_fork_while_another_thread_decodes": "RuntimeError",
    # 7. Silent wrong results
    "whole_state_with_a_cell_of_no_sequence": "StateError",
    "state_file_with_a_cell_of_no_sequence": "StateError",
    "position_that_no_range_can_remove": "ValueError",
    "shift_past_the_last_position": "ValueError",
    "penalties_over_minus_one_tokens": "ValueError",
    "state_with_a_negative_position": "StateError",
    "state_with_a_position_no_range_can_remove": "StateError",
    "sequence_state_with_a_position_no_range_can_remove": "StateError",
    # 9. Leaks
    "abort_callback_bound_to_the_context_owner": "none",
    # 10. Garbage in
    "end_of_generation_before_a_schemas_value_is_complete": "ShimError",
    "schema_with_bounds_past_64_bits": "SchemaError",
    "deeply_nested_schema": "SchemaError",
    "chat_template_that_raises": "ValueError",
    "chat_template_that_does_not_parse": "ChatTemplateError",
    "nan_temperature": "ValueError",
    "nan_logit_bias": "ValueError",
    "infinite_rope_frequency": "ValueError",
    "more_threads_than_cpus": "ValueError",
    "rpc_server_that_closes_after_the_handshake": "RpcError",
    "rpc_server_that_answers_with_the_wrong_sizes": "RpcError",
    "rpc_server_that_answers_the_handshake_with_garbage": "RpcError",
}


#: Cases that run in a child of their own: a signal, a fork, servers on threads, or an
#: allocation as large as the machine, none of which a later case should inherit.
ALONE = {
    "ctrl_c_during_a_decode_nested_in_a_callback",
    "context_used_after_a_fork_while_another_thread_decodes",
    "context_larger_than_the_machine",
    "rpc_server_that_closes_after_the_handshake",
    "rpc_server_that_answers_with_the_wrong_sizes",
    "rpc_server_that_answers_the_handshake_with_garbage",
}


def raised_by(model_path: Path, case: str, stdin: str | None = None) -> str:
    return raised_alone(model_path, "misuse_raises", case, stdin)


@pytest.fixture(scope="module")
def raised_together(model_path: Path) -> dict[str, str]:
    return raised_one_after_another(model_path, "misuse_raises", [case for case in RAISES if case not in ALONE])


@pytest.mark.parametrize(("case", "expected"), RAISES.items(), ids=list(RAISES))
def test_misuse_case_raises_instead_of_crashing(
    model_path: Path, raised_together: dict[str, str], case: str, expected: str
) -> None:
    if raised_together.get(case) != expected:
        assert raised_by(model_path, case) == expected


@pytest.mark.parametrize(
    "case",
    [
        "tokenizing_with_a_model_without_a_tokenizer",
        "token_text_of_a_model_without_a_tokenizer",
        "grammar_on_a_model_without_a_tokenizer",
        "llguidance_on_a_model_without_a_tokenizer",
    ],
)
def test_a_model_without_a_tokenizer_refuses_text(model_path: Path, tmp_path: Path, case: str) -> None:
    vocabulary = synthetic.write_vocabulary(tmp_path / "none.gguf", "none", synthetic.spm_vocabulary())
    assert raised_by(model_path, case, stdin=str(vocabulary)) == "ValueError"


def test_a_sentencepiece_vocabulary_without_a_byte_token_refuses_to_tokenize(model_path: Path, tmp_path: Path) -> None:
    vocabulary = synthetic.write_vocabulary(tmp_path / "spm.gguf", "llama", synthetic.spm_vocabulary(without_byte=0x41))
    case = "tokenizing_without_a_byte_token_to_fall_back_on"
    assert raised_by(model_path, case, stdin=str(vocabulary)) == "ValueError"


def test_a_wordpiece_vocabulary_with_a_byte_token_is_refused(model_path: Path, tmp_path: Path) -> None:
    # llama.cpp renders every token at load, and a WordPiece byte token aborts (found by the fuzzer).
    tokens = [*synthetic.bert_vocabulary(), "<0x41>"]  # marked as a byte token
    vocabulary = synthetic.write_vocabulary(tmp_path / "wpm.gguf", "bert", tokens)
    assert raised_by(model_path, "loading_the_vocabulary_from_stdin", stdin=str(vocabulary)) == "LlamaModelLoadError"
    del tokens[-1]
    vocabulary = synthetic.write_vocabulary(tmp_path / "wpm.gguf", "bert", tokens)
    assert raised_by(model_path, "loading_the_vocabulary_from_stdin", stdin=str(vocabulary)) == "none"


def test_a_complete_sentencepiece_vocabulary_tokenizes(tmp_path: Path) -> None:
    vocabulary = synthetic.write_vocabulary(tmp_path / "spm.gguf", "llama", synthetic.spm_vocabulary())
    model = llamactx.LlamaModel.load_from_file(vocabulary, vocab_only=True)
    tokens = model.str_to_token("ABC", False)
    assert model.detokenize(tokens).endswith("ABC")  # through the byte tokens <0x41>..<0x43>


@pytest.mark.parametrize(
    ("tokenizer", "tokens"),
    [
        # WordPiece vocabularies have no EOS by default, and this one has no EOT either: the
        # sampler asserts there is one when only end-of-generation tokens are left.
        ("bert", synthetic.bert_vocabulary()),
        # Pieces are read into 512-byte buffers, "resized" by a negative length when longer.
        ("llama", [*synthetic.spm_vocabulary(), "x" * 513]),
    ],
    ids=["without_an_end_token", "with_a_piece_over_512_bytes"],
)
def test_infill_refuses_a_vocabulary_it_would_abort_on(
    model_path: Path, tmp_path: Path, tokenizer: str, tokens: list[str]
) -> None:
    vocabulary = synthetic.write_vocabulary(tmp_path / "vocabulary.gguf", tokenizer, tokens)
    assert raised_by(model_path, "infill_on_the_vocabulary_from_stdin", stdin=str(vocabulary)) == "ValueError"


def test_infill_takes_a_vocabulary_with_an_end_token_and_short_pieces(tmp_path: Path) -> None:
    vocabulary = synthetic.write_vocabulary(tmp_path / "spm.gguf", "llama", [*synthetic.spm_vocabulary(), "x" * 512])
    llamactx.LlamaSampler.infill(llamactx.LlamaModel.load_from_file(vocabulary, vocab_only=True))


@pytest.mark.parametrize(
    "case",
    [
        "encoder_decoder_with_a_kv_stream_per_sequence",
        "encoder_decoder_decoding_before_encoding",
        "encoder_decoder_decoding_a_restored_state_without_encoding",
    ],
)
def test_an_encoder_decoder_refuses_what_llama_cpp_asserts_on(model_path: Path, tmp_path: Path, case: str) -> None:
    t5 = synthetic.write_tiny_t5(tmp_path / "t5.gguf")
    assert raised_by(model_path, case, stdin=str(t5)) == "ValueError"


def test_an_encoder_decoder_decodes_after_encoding_in_one_kv_stream(tmp_path: Path) -> None:
    model = llamactx.LlamaModel.load_from_file(synthetic.write_tiny_t5(tmp_path / "t5.gguf"))
    ctx = model.new_context(n_ctx=64, n_batch=64, n_ubatch=64, n_seq_max=2, kv_unified=True)
    rows = []
    for seq, text in enumerate(["the cat sat", "a dog ran"]):
        prompt = llamactx.LlamaBatch(8)
        prompt.add_sequence(model.str_to_token(text, False), seq, True)
        ctx.encode(prompt)
        start = llamactx.LlamaBatch(1)
        start.add(0, 0, [seq], True)  # the decoder start token, <pad>
        ctx.decode(start)
        rows.append(ctx.get_logits_ith(-1).copy())
    assert all(np.isfinite(row).all() for row in rows)
    assert not np.array_equal(rows[0], rows[1])  # each sequence attends to its own encoding


@pytest.mark.parametrize("write", [synthetic.write_tiny_mamba, synthetic.write_tiny_hybrid], ids=["mamba", "hybrid"])
@pytest.mark.parametrize(
    "case", ["recurrent_sequence_state_of_two_cells", "recurrent_whole_state_with_a_cell_of_no_sequence"]
)
def test_recurrent_states_llama_cpp_would_abort_on_or_keep_are_refused(
    model_path: Path, tmp_path: Path, write: Callable[[Path], Path], case: str
) -> None:
    recurrent = write(tmp_path / "recurrent.gguf")
    assert raised_by(model_path, case, stdin=str(recurrent)) == "StateError"


def test_a_recurrent_sequence_state_moves_to_another_sequence(tmp_path: Path) -> None:
    mamba = llamactx.LlamaModel.load_from_file(synthetic.write_tiny_mamba(tmp_path / "mamba.gguf"))
    ctx = mamba.new_context(n_ctx=64, n_seq_max=2)
    prompt = [1, 10, 20, 30, 40]

    def next_logits(seq: int) -> np.ndarray:
        batch = llamactx.LlamaBatch(1)
        batch.add(7, len(prompt), [seq], True)
        ctx.decode(batch)
        return ctx.get_logits_ith(-1).copy()

    batch = llamactx.LlamaBatch(len(prompt))
    batch.add_sequence(prompt, 0, False)
    ctx.decode(batch)
    state = ctx.state_seq_get_data(0)
    expected = next_logits(0)
    ctx.clear_kv_cache()
    ctx.state_seq_set_data(state, 1)
    assert np.array_equal(next_logits(1), expected)


def test_an_adapter_no_cpu_kernel_multiplies_is_refused(model_path: Path, tmp_path: Path) -> None:
    adapter = synthetic.write_lora_for_smollm2(tmp_path / "f64.gguf", dtype=np.float64)
    assert raised_by(model_path, "adapter_no_cpu_kernel_multiplies", stdin=str(adapter)) == "LlamaLoraAdapterInitError"


@pytest.mark.parametrize("case", ["context_past_the_learned_positions", "positions_past_the_table_in_a_padded_context"])
def test_a_context_never_reaches_past_a_models_learned_positions(model_path: Path, tmp_path: Path, case: str) -> None:
    bert = synthetic.write_tiny_bert(tmp_path / "bert.gguf")
    assert raised_by(model_path, case, stdin=str(bert)) == "ValueError"


def test_a_draft_model_holding_fewer_positions_than_the_engine_is_refused(model_path: Path, tmp_path: Path) -> None:
    draft = synthetic.write_tiny_gpt2(model_path, tmp_path / "gpt2.gguf", context=64)
    case = "draft_model_holding_fewer_positions_than_the_engine"
    assert raised_by(model_path, case, stdin=str(draft)) == "ValueError"


def test_a_model_with_learned_positions_takes_as_many_tokens_as_they_hold(tmp_path: Path) -> None:
    bert = llamactx.LlamaModel.load_from_file(synthetic.write_tiny_bert(tmp_path / "bert.gguf"))
    ctx = bert.new_context(n_batch=512, n_ubatch=512, embeddings=True)  # n_ctx unset: bounded to the table
    whole = llamactx.LlamaBatch(synthetic.BERT_CONTEXT)
    whole.add_sequence([5] * synthetic.BERT_CONTEXT, 0, True)
    ctx.encode(whole)
    assert np.isfinite(ctx.embeddings_seq_ith(0)).all()
    past = llamactx.LlamaBatch(synthetic.BERT_CONTEXT + 1)
    past.add_sequence([5] * (synthetic.BERT_CONTEXT + 1), 0, True)
    with pytest.raises(ValueError, match="learned position embeddings hold positions 0 to 127"):
        ctx.encode(past)
    with pytest.raises(ValueError, match="past the 128 positions"):
        bert.new_context(n_ctx=129)
