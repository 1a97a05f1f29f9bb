"""Inputs that would abort or corrupt llama.cpp if they reached it (see test_guards.py). Each
case prints ``RAISED`` and the name of the exception it raised, or ``RAISED none``."""

from __future__ import annotations

import harness

import llamactx

CASES: list[harness.Case] = []
case = harness.reporting(CASES)


def small_context(model: llamactx.LlamaModel) -> tuple[llamactx.LlamaContext, llamactx.LlamaBatch]:
    """A context of 2 sequences taking 8 tokens per decode, and a batch with room for 16."""
    return model.new_context(n_ctx=256, n_batch=8, n_seq_max=2), llamactx.LlamaBatch(16, 2)


@case
def token_past_the_vocabulary_in_a_decode(model: llamactx.LlamaModel) -> None:
    ctx, batch = small_context(model)
    batch.add(model.n_vocab(), 0, [0], True)
    ctx.decode(batch)


@case
def negative_token_id(model: llamactx.LlamaModel) -> None:
    _, batch = small_context(model)
    batch.add(-1, 0, [0], True)


@case
def sequence_id_past_n_seq_max_in_a_decode(model: llamactx.LlamaModel) -> None:
    ctx, batch = small_context(model)
    batch.add(1, 0, [2], True)
    ctx.decode(batch)


@case
def more_seq_ids_than_the_batch_holds(model: llamactx.LlamaModel) -> None:
    _, batch = small_context(model)
    batch.add(1, 0, [0, 1, 0], True)


@case
def empty_seq_ids(model: llamactx.LlamaModel) -> None:
    _, batch = small_context(model)
    batch.add(1, 0, [], True)


@case
def more_tokens_than_n_batch(model: llamactx.LlamaModel) -> None:
    ctx, batch = small_context(model)
    batch.add_sequence(list(range(9)), 0, False)
    ctx.decode(batch)


@case
def token_to_str_past_the_vocabulary(model: llamactx.LlamaModel) -> None:
    model.token_to_str(10**6)


@case
def detokenize_a_negative_id(model: llamactx.LlamaModel) -> None:
    model.detokenize([5, -3])


@case
def is_eog_token_past_the_vocabulary(model: llamactx.LlamaModel) -> None:
    model.is_eog_token(model.n_vocab())


@case
def token_id_past_int32(model: llamactx.LlamaModel) -> None:
    model.detokenize([2**40])


@case
def kv_op_on_a_sequence_past_n_seq_max(model: llamactx.LlamaModel) -> None:
    ctx, _ = small_context(model)
    ctx.kv_cache_seq_pos_max(5)


@case
def kv_copy_into_a_negative_sequence(model: llamactx.LlamaModel) -> None:
    ctx, _ = small_context(model)
    ctx.copy_kv_cache_seq(0, -1)


@case
def kv_cache_seq_div_by_zero(model: llamactx.LlamaModel) -> None:
    ctx, _ = small_context(model)
    ctx.kv_cache_seq_div(0, None, None, 0)


@case
def kv_cache_seq_div_by_256(model: llamactx.LlamaModel) -> None:
    ctx, _ = small_context(model)
    ctx.kv_cache_seq_div(0, None, None, 256)


@case
def sampling_before_any_decode(model: llamactx.LlamaModel) -> None:
    ctx, _ = small_context(model)
    llamactx.LlamaSampler.greedy().sample(ctx, 0)


@case
def logits_of_a_row_past_n_ctx(model: llamactx.LlamaModel) -> None:
    ctx, batch = small_context(model)
    batch.add(1, 0, [0], True)
    ctx.decode(batch)
    ctx.get_logits_ith(10**6)


@case
def mean_pooling_that_cannot_split_micro_batches(model: llamactx.LlamaModel) -> None:
    model.new_context(embeddings=True, pooling_type=llamactx.LlamaPoolingType.MEAN, n_seq_max=3)


@case
def metadata_key_with_a_nul_byte(model: llamactx.LlamaModel) -> None:
    model.meta_val_str("general\0name")


@case
def huge_batch_allocation(model: llamactx.LlamaModel) -> None:
    llamactx.LlamaBatch(2**40, 2**10)


@case
def encode_on_a_decoder_only_model(model: llamactx.LlamaModel) -> None:
    ctx, batch = small_context(model)
    batch.add(1, 0, [0], True)
    ctx.encode(batch)


@case
def partial_copy_between_per_sequence_kv_streams(model: llamactx.LlamaModel) -> None:
    ctx, batch = small_context(model)
    batch.add_sequence([1, 2, 3, 4], 0, False)
    ctx.decode(batch)
    ctx.copy_cache(0, 1, 2)


@case
def end_of_generation_accepted_by_an_unfinished_grammar(model: llamactx.LlamaModel) -> None:
    llamactx.LlamaSampler.grammar(model, 'root ::= "a"').accept(model.token_eos())


@case
def grammar_accept_past_the_vocabulary(model: llamactx.LlamaModel) -> None:
    llamactx.LlamaSampler.grammar(model, 'root ::= "a"').accept(model.n_vocab())


@case
def a_backend_sampler_that_is_not_a_chain(model: llamactx.LlamaModel) -> None:
    ctx, batch = small_context(model)
    ctx.set_sampler(0, llamactx.LlamaSampler.greedy())
    batch.add(1, 0, [0], True)
    ctx.decode(batch)
    assert ctx.get_sampled_token_ith(-1) >= 0


@case
def device_only_sequence_state_flag(model: llamactx.LlamaModel) -> None:
    ctx, _ = small_context(model)
    ctx.state_seq_get_data_ext(0, 2)


@case
def sequence_state_past_n_seq_max(model: llamactx.LlamaModel) -> None:
    ctx, _ = small_context(model)
    ctx.state_seq_get_size(9)


@case
def huge_token_capacity_on_load(model: llamactx.LlamaModel) -> None:
    ctx, _ = small_context(model)
    ctx.state_load_file(model.path, 2**40)


@case
def control_vector_of_the_wrong_width(model: llamactx.LlamaModel) -> None:
    ctx, _ = small_context(model)
    ctx.set_adapter_cvec([1.0] * 10, 7, 1, 2)


@case
def logits_after_a_state_restore(model: llamactx.LlamaModel) -> None:
    ctx, batch = small_context(model)
    batch.add(1, 0, [0], True)
    ctx.decode(batch)
    ctx.state_set_data(ctx.state_get_data())
    ctx.get_logits()


@case
def zero_sized_batch(model: llamactx.LlamaModel) -> None:
    llamactx.LlamaBatch(0)


if __name__ == "__main__":
    harness.run(*CASES)
