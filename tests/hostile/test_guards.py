"""Inputs that would abort or corrupt llama.cpp if they reached it, each run in a child process
(``support/children/hostile_inputs.py``) so that a crash fails the test instead of killing pytest:
all in one child, one after another, and a case whose outcome there is not the one expected
again alone, which decides."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.processes import raised_alone, raised_one_after_another

RAISES = {
    "token_past_the_vocabulary_in_a_decode": "ValueError",
    "negative_token_id": "ValueError",
    "sequence_id_past_n_seq_max_in_a_decode": "ValueError",
    "more_seq_ids_than_the_batch_holds": "ValueError",
    "empty_seq_ids": "ValueError",
    "more_tokens_than_n_batch": "ValueError",
    "token_to_str_past_the_vocabulary": "ValueError",
    "detokenize_a_negative_id": "ValueError",
    "is_eog_token_past_the_vocabulary": "ValueError",
    "token_id_past_int32": "ValueError",
    "kv_op_on_a_sequence_past_n_seq_max": "ValueError",
    "kv_copy_into_a_negative_sequence": "ValueError",
    "kv_cache_seq_div_by_zero": "ValueError",
    "kv_cache_seq_div_by_256": "ValueError",
    "sampling_before_any_decode": "IndexError",
    "logits_of_a_row_past_n_ctx": "IndexError",
    "mean_pooling_that_cannot_split_micro_batches": "ValueError",
    "metadata_key_with_a_nul_byte": "ValueError",
    "huge_batch_allocation": "ValueError",
    "encode_on_a_decoder_only_model": "ValueError",
    "partial_copy_between_per_sequence_kv_streams": "ValueError",
    "end_of_generation_accepted_by_an_unfinished_grammar": "ShimError",
    "grammar_accept_past_the_vocabulary": "ValueError",
    "a_backend_sampler_that_is_not_a_chain": "none",
    "device_only_sequence_state_flag": "ValueError",
    "sequence_state_past_n_seq_max": "ValueError",
    "huge_token_capacity_on_load": "ValueError",
    "control_vector_of_the_wrong_width": "ValueError",
    "logits_after_a_state_restore": "IndexError",
    "zero_sized_batch": "ValueError",
}


@pytest.fixture(scope="module")
def raised_together(model_path: Path) -> dict[str, str]:
    return raised_one_after_another(model_path, "hostile_inputs", list(RAISES))


@pytest.mark.parametrize(("case", "expected"), RAISES.items(), ids=list(RAISES))
def test_hostile_input_raises_instead_of_crashing(
    model_path: Path, raised_together: dict[str, str], case: str, expected: str
) -> None:
    if raised_together.get(case) != expected:
        assert raised_alone(model_path, "hostile_inputs", case) == expected
