"""What an independent red team found could kill the interpreter or hang it (issue 17): each
case prints ``RAISED`` and the name of the exception it raised (``none`` if it returned), and
``tests/hostile/test_misuse_raises.py`` checks the name. A crash or a hang fails the test, not pytest."""

from __future__ import annotations

import gc
import os
import signal
import struct
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import crafted_states
import fake_rpc
import harness

import llamactx
from llamactx import LlamaSampler

CASES: list[harness.Case] = []
case = harness.reporting(CASES)


def prompted(model: llamactx.LlamaModel, **options: Any) -> llamactx.LlamaContext:
    """A context that has decoded a short prompt, with logits for its last token."""
    ctx = model.new_context(n_ctx=256, **options)
    tokens = model.str_to_token("The capital of France is", True)
    batch = llamactx.LlamaBatch(len(tokens))
    batch.add_sequence(tokens, 0, False)
    ctx.decode(batch)
    return ctx


# 1. Sampling that cannot select a token


@case
def sampler_without_a_selecting_stage(model: llamactx.LlamaModel) -> None:
    LlamaSampler.top_k(40).sample(prompted(model), -1)


@case
def generate_with_top_k_alone(model: llamactx.LlamaModel) -> None:
    llamactx.generate(model.new_context(n_ctx=256), "Hello", sampler=LlamaSampler.top_k(40))


@case
def sampling_pooled_embeddings(model: llamactx.LlamaModel) -> None:
    ctx = prompted(model, embeddings=True, pooling_type=llamactx.LlamaPoolingType.MEAN)
    LlamaSampler.greedy().sample(ctx, -1)


@case
def logits_of_pooled_embeddings(model: llamactx.LlamaModel) -> None:
    prompted(model, embeddings=True, pooling_type=llamactx.LlamaPoolingType.MEAN).get_logits()


# 2. Grammars


@case
def grammar_after_top_k_keeps_no_candidate(model: llamactx.LlamaModel) -> None:
    grammar = LlamaSampler.grammar(model, 'root ::= "zzzqqq"')
    LlamaSampler.chain([LlamaSampler.top_k(5), grammar, LlamaSampler.greedy()]).sample(prompted(model), -1)


def refused_grammar(model: llamactx.LlamaModel) -> LlamaSampler:
    grammar = LlamaSampler.chain([LlamaSampler.grammar(model, 'root ::= "yes"'), LlamaSampler.greedy()])
    try:
        grammar.accept(model.str_to_token("no", False)[0])
    except llamactx.ShimError:
        return grammar
    raise AssertionError("the grammar accepted a token it cannot take")


@case
def grammar_reused_after_a_refused_token(model: llamactx.LlamaModel) -> None:
    refused_grammar(model).sample(prompted(model), -1)


@case
def grammar_chained_after_a_refused_token(model: llamactx.LlamaModel) -> None:
    LlamaSampler.chain([refused_grammar(model)])


@case
def grammar_reset_after_a_refused_token(model: llamactx.LlamaModel) -> None:
    grammar = refused_grammar(model)
    grammar.reset()
    assert model.token_to_str(grammar.sample(prompted(model), -1)).strip() in "yes"


def lazy_grammar(model: llamactx.LlamaModel, pattern: str) -> LlamaSampler:
    return LlamaSampler.grammar_lazy_patterns(model, 'root ::= "yes"', "root", [pattern], [])


@case
def lazy_grammar_with_an_invalid_pattern(model: llamactx.LlamaModel) -> None:
    lazy_grammar(model, "([")


@case
def lazy_grammar_with_a_deeply_nested_pattern(model: llamactx.LlamaModel) -> None:
    lazy_grammar(model, "(" * 5000 + "a" + ")" * 5000)


@case
def lazy_grammar_with_a_valid_pattern(model: llamactx.LlamaModel) -> None:
    lazy_grammar(model, r"^\s*answer:")


@case
def lazy_grammar_with_a_deeply_nested_look_around(model: llamactx.LlamaModel) -> None:
    """Within the 1 KiB limit, nested past the 32 groups fancy-regex's recursive parser gets."""
    lazy_grammar(model, "(?=" + "(" * 300 + "a" + ")" * 300 + ")")


@case
def lazy_grammar_waiting_through_a_look_around_pattern_that_backtracks(model: llamactx.LlamaModel) -> None:
    """Two ways through each ``a``, both backtracked into when the ``b`` does not come: each
    search stops at the backtracking limit, which fails the sampler instead of hanging it."""
    grammar = LlamaSampler.grammar_lazy_patterns(model, 'root ::= "b"', "root", ["(?:(?=a)a|a)*b"], [])
    (four_as,) = model.str_to_token("aaaa", False)
    for _ in range(64):
        grammar.accept(four_as)


@case
def lazy_grammar_waiting_through_a_backtracking_pattern(model: llamactx.LlamaModel) -> None:
    """llama.cpp's std::regex took minutes for 1,000 tokens here, and could overflow the stack."""
    grammar = LlamaSampler.grammar_lazy_patterns(model, "root ::= [ac]+", "root", ["(a|aa)*c"], [])
    (four_as,) = model.str_to_token("aaaa", False)
    for _ in range(20_000):
        grammar.accept(four_as)
    grammar.accept(model.str_to_token("c", False)[0])


# 3. Parameters llama.cpp asserts on


@case
def more_sequences_than_batch_rows(model: llamactx.LlamaModel) -> None:
    model.new_context(n_ctx=4, n_seq_max=8)


@case
def mean_pooling_switched_on_later(model: llamactx.LlamaModel) -> None:
    model.new_context(pooling_type=llamactx.LlamaPoolingType.MEAN, n_seq_max=3).set_embeddings(True)


@case
def context_of_a_vocabulary_only_model(model: llamactx.LlamaModel) -> None:
    llamactx.LlamaModel.load_from_file(model.path, vocab_only=True).new_context()


def encoder_decoder_from_stdin(**options: Any) -> llamactx.LlamaContext:
    """A context of the T5-style model whose path the test writes on standard input."""
    model = llamactx.LlamaModel.load_from_file(sys.stdin.read().strip())
    return model.new_context(n_ctx=64, n_batch=64, n_ubatch=64, **options)


# Third red team, 10: llama.cpp reads a model's learned position embeddings (GPT-2, StarCoder,
# BERT, MPT) by row, and asserts (GGML_ASSERT(i01 < ne01)) on a position past the table, which
# it neither checks nor bounds n_ctx by (and it pads n_ctx to a multiple of 256).


def learned_positions_from_stdin() -> llamactx.LlamaModel:
    """The model with learned positions whose path the test writes on standard input."""
    return llamactx.LlamaModel.load_from_file(sys.stdin.read().strip())


def encoding(tokens: int) -> llamactx.LlamaBatch:
    batch = llamactx.LlamaBatch(tokens)
    batch.add_sequence([5] * tokens, 0, True)
    return batch


@case
def context_past_the_learned_positions(model: llamactx.LlamaModel) -> None:
    bert = learned_positions_from_stdin()
    ctx = bert.new_context(n_ctx=256, n_batch=256, n_ubatch=256, embeddings=True)
    ctx.encode(encoding(200))


@case
def positions_past_the_table_in_a_padded_context(model: llamactx.LlamaModel) -> None:
    bert = learned_positions_from_stdin()
    ctx = bert.new_context(n_ctx=128, n_batch=256, n_ubatch=256, embeddings=True)
    ctx.encode(encoding(200))


@case
def draft_model_holding_fewer_positions_than_the_engine(model: llamactx.LlamaModel) -> None:
    draft = llamactx.DraftModel(learned_positions_from_stdin())
    with llamactx.Engine(model, n_ctx=512, n_seq_max=1, speculative=draft) as engine:
        engine.submit("The " * 100, max_tokens=8).result()


def one_token(token: int, pos: int = 0) -> llamactx.LlamaBatch:
    batch = llamactx.LlamaBatch(1)
    batch.add(token, pos, [0], True)
    return batch


@case
def encoder_decoder_with_a_kv_stream_per_sequence(model: llamactx.LlamaModel) -> None:
    encoder_decoder_from_stdin(n_seq_max=2, kv_unified=False)


@case
def encoder_decoder_decoding_before_encoding(model: llamactx.LlamaModel) -> None:
    encoder_decoder_from_stdin().decode(one_token(0))


@case
def encoder_decoder_decoding_a_restored_state_without_encoding(model: llamactx.LlamaModel) -> None:
    ctx = encoder_decoder_from_stdin()
    ctx.encode(one_token(3))
    ctx.decode(one_token(0))
    fresh = ctx.model.new_context(n_ctx=64, n_batch=64, n_ubatch=64)
    fresh.set_state_data(ctx.copy_state_data())  # the KV cache, not the encoder's output
    fresh.decode(one_token(5, pos=1))


# 4. Capabilities claimed but absent


@case
def shifting_a_bf16_k_cache(model: llamactx.LlamaModel) -> None:
    ctx = prompted(model, cache_type_k="bf16")
    if ctx.memory_can_shift():
        raise AssertionError("memory_can_shift() claims a shift the CPU cannot do")
    ctx.kv_cache_seq_add(0, None, None, 4)


@case
def adapter_no_cpu_kernel_multiplies(model: llamactx.LlamaModel) -> None:
    """The adapter's path comes on standard input (the test writes it: float64 tensors)."""
    ctx = prompted(model)
    ctx.lora_adapter_set(model.lora_adapter_init(sys.stdin.read().strip()), 1.0)
    decode_one_more(ctx)


def vocabulary_from_stdin() -> llamactx.LlamaModel:
    """The vocabulary-only model whose path the test writes on standard input."""
    return llamactx.LlamaModel.load_from_file(sys.stdin.read().strip(), vocab_only=True)


@case
def loading_the_vocabulary_from_stdin(model: llamactx.LlamaModel) -> None:
    vocabulary_from_stdin()


@case
def tokenizing_with_a_model_without_a_tokenizer(model: llamactx.LlamaModel) -> None:
    vocabulary_from_stdin().str_to_token("hello", False)


@case
def token_text_of_a_model_without_a_tokenizer(model: llamactx.LlamaModel) -> None:
    vocabulary_from_stdin().token_to_bytes(3)


@case
def grammar_on_a_model_without_a_tokenizer(model: llamactx.LlamaModel) -> None:
    LlamaSampler.grammar(vocabulary_from_stdin(), 'root ::= "a"')


@case
def llguidance_on_a_model_without_a_tokenizer(model: llamactx.LlamaModel) -> None:
    LlamaSampler.llguidance(vocabulary_from_stdin(), "json_schema", '{"type": "integer"}')


@case
def tokenizing_without_a_byte_token_to_fall_back_on(model: llamactx.LlamaModel) -> None:
    vocabulary_from_stdin().str_to_token("ABC", False)


@case
def infill_on_the_vocabulary_from_stdin(model: llamactx.LlamaModel) -> None:
    LlamaSampler.infill(vocabulary_from_stdin())


def backend_sampled(model: llamactx.LlamaModel, chain: LlamaSampler) -> int:
    """The token `chain`, set as sequence 0's backend sampler, draws for one more token."""
    ctx = prompted(model)
    ctx.set_sampler(0, chain)
    decode_one_more(ctx)
    return ctx.get_sampled_token_ith(-1)


def on_the_backend(model: llamactx.LlamaModel, *stages: LlamaSampler) -> None:
    backend_sampled(model, LlamaSampler.chain([*stages, LlamaSampler.greedy()]))


@case
def backend_top_k_beyond_the_candidates(model: llamactx.LlamaModel) -> None:
    on_the_backend(model, LlamaSampler.top_k(200_000))


@case
def backend_logit_bias_past_an_earlier_top_k(model: llamactx.LlamaModel) -> None:
    on_the_backend(model, LlamaSampler.top_k(10), LlamaSampler.logit_bias(model.n_vocab(), [(1000, 1.0)]))


@case
def backend_logit_bias_after_top_k(model: llamactx.LlamaModel) -> None:
    on_the_backend(model, LlamaSampler.top_k(40), LlamaSampler.logit_bias(model.n_vocab(), [(5, 1.0)]))


@case
def backend_penalties_of_another_vocabulary(model: llamactx.LlamaModel) -> None:
    on_the_backend(model, LlamaSampler.penalties(100, 64, 1.1, 0.0, 0.0))


@case
def backend_stage_after_dist(model: llamactx.LlamaModel) -> None:
    on_the_backend(model, LlamaSampler.dist(7))


@case
def backend_third_top_k_or_top_p(model: llamactx.LlamaModel) -> None:
    on_the_backend(model, LlamaSampler.top_k(40), LlamaSampler.top_p(0.9, 1), LlamaSampler.top_k(20))


@case
def backend_top_k_after_a_temperature_of_zero(model: llamactx.LlamaModel) -> None:
    # On the backend, temp(0) keeps one candidate (top_k(1)); top_k(40) then asserts.
    on_the_backend(model, LlamaSampler.temp(0.0), LlamaSampler.top_k(40))


@case
def backend_chain_past_its_graph_size(model: llamactx.LlamaModel) -> None:
    on_the_backend(model, *(LlamaSampler.min_p(0.05, 1) for _ in range(300)))


@case
def backend_chain_that_fits(model: llamactx.LlamaModel) -> None:
    on_the_backend(model, LlamaSampler.top_k(40), LlamaSampler.temp(0.8))


@case
def backend_chain_ending_in_dist(model: llamactx.LlamaModel) -> None:
    stages = [LlamaSampler.penalties(model.n_vocab(), 64, 1.1, 0.0, 0.0), LlamaSampler.top_k(40)]
    token = backend_sampled(model, LlamaSampler.chain([*stages, LlamaSampler.top_p(0.9, 1), LlamaSampler.dist(7)]))
    assert 0 <= token < model.n_vocab()


def decode_one_more(ctx: llamactx.LlamaContext) -> None:
    batch = llamactx.LlamaBatch(1)
    batch.add(1, ctx.kv_cache_seq_pos_max(0) + 1, [0], True)
    ctx.decode(batch)


# 5. Sizes taken from user numbers


@case
def context_larger_than_the_machine(model: llamactx.LlamaModel) -> None:
    # 2**29 cells: llama.cpp's per-cell arrays alone (24 GiB) are written before its KV cache
    # (11 TiB) fails to allocate, which ends in the OOM killer on most machines.
    model.new_context(n_ctx=2**29)


@case
def penalty_window_of_a_billion_tokens(model: llamactx.LlamaModel) -> None:
    LlamaSampler.penalties(model.n_vocab(), 1_000_000_000, 1.1, 0.0, 0.0)


@case
def dry_window_of_a_billion_tokens(model: llamactx.LlamaModel) -> None:
    LlamaSampler.dry(model, 0.8, 1.75, 2, 1_000_000_000)


@case
def batch_of_a_hundred_million_tokens(model: llamactx.LlamaModel) -> None:
    llamactx.LlamaBatch(100_000_000)


HUGE_NAME = (2**31).to_bytes(4, "little") + b"llama" * 20


@case
def state_announcing_a_2_gib_architecture_name(model: llamactx.LlamaModel) -> None:
    prompted(model).state_set_data(HUGE_NAME)


@case
def state_file_announcing_a_2_gib_architecture_name(model: llamactx.LlamaModel) -> None:
    header = b"".join(n.to_bytes(4, "little") for n in (0x6767736E, 11, 1, 7))
    path = Path(tempfile.mkdtemp()) / "state.bin"
    path.write_bytes(header + HUGE_NAME)
    prompted(model).state_load_file(path, 8)


# 6. Re-entrancy and signals


def decode_calling(model: llamactx.LlamaModel, call: str) -> None:
    ctx = model.new_context(n_ctx=256)
    batch = llamactx.LlamaBatch(8)
    batch.add_sequence(model.str_to_token("one two three four", True), 0, False)
    calls = {"context": ctx.n_ctx, "batch": batch.clear}
    ctx.set_abort_callback(lambda: calls[call]() and False)
    ctx.decode(batch)


@case
def abort_callback_calling_its_context(model: llamactx.LlamaModel) -> None:
    decode_calling(model, "context")


@case
def abort_callback_calling_its_batch(model: llamactx.LlamaModel) -> None:
    decode_calling(model, "batch")


@case
def ctrl_c_during_a_decode_nested_in_a_callback(model: llamactx.LlamaModel) -> None:
    outer, inner = model.new_context(n_ctx=512), model.new_context(n_ctx=512)
    tokens = model.str_to_token("the quick brown fox " * 40, False)[:128]

    def batch() -> llamactx.LlamaBatch:
        made = llamactx.LlamaBatch(len(tokens))
        made.add_sequence(tokens, 0, False)
        return made

    calls = []

    def press_ctrl_c() -> bool:
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return False

    def decode_inner() -> bool:
        inner.decode(batch())
        return False

    inner.set_abort_callback(press_ctrl_c)
    outer.set_abort_callback(decode_inner)
    outer.decode(batch())


@case
def context_used_after_a_fork_while_another_thread_decodes(model: llamactx.LlamaModel) -> None:
    ctx = model.new_context(n_ctx=512)
    tokens = model.str_to_token("the quick brown fox " * 40, False)[:128]
    batch = llamactx.LlamaBatch(len(tokens))
    batch.add_sequence(tokens, 0, False)
    decoding, forked = threading.Event(), threading.Event()

    def slowly() -> bool:
        # Slow until the fork is done, so that it happens while the decode runs; then at full speed.
        decoding.set()
        if not forked.is_set():
            time.sleep(0.01)
        return False

    ctx.set_abort_callback(slowly)
    worker = threading.Thread(target=ctx.decode, args=(batch,))
    worker.start()
    decoding.wait()
    child = os.fork()
    if child == 0:
        try:
            ctx.n_ctx()
        except RuntimeError:
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    forked.set()
    worker.join()
    if os.waitstatus_to_exitcode(status) == 3:
        raise RuntimeError("the child was refused the context")


def model_from_stdin() -> llamactx.LlamaModel:
    """The model whose path the test writes on standard input."""
    return llamactx.LlamaModel.load_from_file(sys.stdin.read().strip())


def filled(ctx: llamactx.LlamaContext, sequences: int) -> llamactx.LlamaContext:
    """``ctx`` with four tokens decoded in each of its first ``sequences`` sequences."""
    for seq in range(sequences):
        batch = llamactx.LlamaBatch(4)
        batch.add_sequence([1, 10 + seq, 20, 30], seq, False)
        ctx.decode(batch)
    return ctx


@case
def recurrent_sequence_state_of_two_cells(model: llamactx.LlamaModel) -> None:
    """On a recurrent (Mamba) or hybrid model from stdin, whose recurrent part follows the KV part."""
    stdin_model = model_from_stdin()
    ctx = filled(stdin_model.new_context(n_ctx=64, n_seq_max=2), 1)
    state = ctx.state_seq_get_data(0)
    recurrent_at = 8  # after io_magic and the sequence id
    if stdin_model.meta_val_str("general.architecture") != "mamba":
        recurrent_at += crafted_states.kv_part_length(state[8:])
    ctx.state_seq_set_data(crafted_states.as_two_cells(state, recurrent_at), 0)


# 7. Silent wrong results


@case
def whole_state_with_a_cell_of_no_sequence(model: llamactx.LlamaModel) -> None:
    ctx = filled(model.new_context(n_ctx=256, n_seq_max=2), 2)
    state = ctx.copy_state_data()
    first_cell = crafted_states.memory_at(state) + 8  # after the stream and cell counts
    try:
        ctx.set_state_data(crafted_states.without_an_owner(state, first_cell))
    finally:
        assert ctx.copy_state_data() == state


@case
def state_file_with_a_cell_of_no_sequence(model: llamactx.LlamaModel) -> None:
    ctx = filled(model.new_context(n_ctx=256), 1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "session.bin"
        ctx.state_save_file(path, [1, 2, 3])
        saved = path.read_bytes()
        state_at = 12 + 4 * 3  # magic, version, token count, tokens
        first_cell = state_at + crafted_states.memory_at(saved[state_at:]) + 8
        path.write_bytes(crafted_states.without_an_owner(saved, first_cell))
        try:
            ctx.state_load_file(path, 16)
        finally:
            path.write_bytes(saved)
            assert ctx.state_load_file(path, 16) == [1, 2, 3]


@case
def recurrent_whole_state_with_a_cell_of_no_sequence(model: llamactx.LlamaModel) -> None:
    """On a recurrent (Mamba) or hybrid model from stdin. Accepted, the cell's state would be
    where a new sequence starts instead of zeros."""
    stdin_model = model_from_stdin()
    ctx = filled(stdin_model.new_context(n_ctx=64, n_seq_max=2), 2)
    state = ctx.copy_state_data()
    recurrent_at = crafted_states.memory_at(state)
    if stdin_model.meta_val_str("general.architecture") != "mamba":
        recurrent_at += crafted_states.kv_part_length(state[recurrent_at:])
    try:
        ctx.set_state_data(crafted_states.without_an_owner(state, recurrent_at + 4))
    finally:
        assert ctx.set_state_data(state) == len(state)


@case
def position_that_no_range_can_remove(model: llamactx.LlamaModel) -> None:
    llamactx.LlamaBatch(1).add(1, 2**31 - 1, [0], True)


@case
def shift_past_the_last_position(model: llamactx.LlamaModel) -> None:
    prompted(model).kv_cache_seq_add(0, None, None, 2**31 - 4)


@case
def penalties_over_minus_one_tokens(model: llamactx.LlamaModel) -> None:
    LlamaSampler.penalties(model.n_vocab(), -1, 1.1, 0.0, 0.0)


def restore_with_cell_0_at(model: llamactx.LlamaModel, position: int, *, sequence: bool) -> None:
    """Restores this context's own state with the first cell's position replaced; checks that a
    refused restore left the KV cache as it was."""
    ctx = prompted(model)
    state = ctx.state_seq_get_data(0) if sequence else ctx.state_get_data()
    # The first cell's position follows the header (io_magic and sequence id; or the
    # architecture name), the stream count and the cell count.
    offset = 16 if sequence else 4 + struct.unpack_from("<I", state)[0] + 8
    crafted = bytearray(state)
    struct.pack_into("<i", crafted, offset, position)
    before = (ctx.memory_seq_pos_min(0), ctx.kv_cache_seq_pos_max(0))
    try:
        if sequence:
            ctx.state_seq_set_data(bytes(crafted), 0)
        else:
            ctx.state_set_data(bytes(crafted))
    finally:
        assert (ctx.memory_seq_pos_min(0), ctx.kv_cache_seq_pos_max(0)) == before


@case
def state_with_a_negative_position(model: llamactx.LlamaModel) -> None:
    restore_with_cell_0_at(model, -7, sequence=False)


@case
def state_with_a_position_no_range_can_remove(model: llamactx.LlamaModel) -> None:
    restore_with_cell_0_at(model, 2**31 - 1, sequence=False)


@case
def sequence_state_with_a_position_no_range_can_remove(model: llamactx.LlamaModel) -> None:
    restore_with_cell_0_at(model, 2**31 - 1, sequence=True)


# 9. Leaks


@case
def abort_callback_bound_to_the_context_owner(model: llamactx.LlamaModel) -> None:
    class Owner:
        def __init__(self) -> None:
            self.ctx = model.new_context(n_ctx=256)
            self.ctx.set_abort_callback(self.keep_going)

        def keep_going(self) -> bool:
            return False

    owner = weakref.ref(Owner())
    gc.collect()
    if owner() is not None:
        raise MemoryError("the context and its owner were never collected")


# 10. Garbage in


@case
def nan_temperature(model: llamactx.LlamaModel) -> None:
    LlamaSampler.temp(float("nan"))


@case
def nan_logit_bias(model: llamactx.LlamaModel) -> None:
    LlamaSampler.logit_bias(model.n_vocab(), [(1, float("nan"))])


@case
def infinite_rope_frequency(model: llamactx.LlamaModel) -> None:
    model.new_context(n_ctx=256, rope_freq_base=float("inf"))


@case
def more_threads_than_cpus(model: llamactx.LlamaModel) -> None:
    model.new_context(n_ctx=256, n_threads=len(os.sched_getaffinity(0)) + 1)


# Structured output and chat templates.
@case
def end_of_generation_before_a_schemas_value_is_complete(model: llamactx.LlamaModel) -> None:
    LlamaSampler.llguidance(model, "json_schema", '{"type": "integer"}').accept(model.token_eos())


@case
def schema_with_bounds_past_64_bits(model: llamactx.LlamaModel) -> None:
    schema = '{"type": "array", "items": {"type": "integer", "maximum": 1e400}, "minItems": 18446744073709551616}'
    llamactx.generate(model.new_context(n_ctx=256), "x", max_tokens=4, json_schema=schema)


@case
def deeply_nested_schema(model: llamactx.LlamaModel) -> None:
    LlamaSampler.llguidance(model, "json_schema", '{"items": ' * 5000 + "{}" + "}" * 5000)


@case
def chat_template_that_raises(model: llamactx.LlamaModel) -> None:
    templates = llamactx._llamactx._ChatTemplates(model, "{{ raise_exception('refused') }}")
    templates.apply('[{"role": "user", "content": "hi"}]', "[]", "auto", False)


@case
def chat_template_that_does_not_parse(model: llamactx.LlamaModel) -> None:
    llamactx._llamactx._ChatTemplates(model, "{% for %}")


@case
def rpc_server_that_closes_after_the_handshake(model: llamactx.LlamaModel) -> None:
    endpoint = fake_rpc.start([])
    llamactx.LlamaModel.load_from_file(model.path, rpc_servers=[endpoint], rpc_timeout=2)


@case
def rpc_server_that_answers_with_the_wrong_sizes(model: llamactx.LlamaModel) -> None:
    endpoint = fake_rpc.start([(2**40).to_bytes(8, "little"), bytes(3), bytes(100)])
    llamactx.LlamaModel.load_from_file(model.path, rpc_servers=[endpoint], rpc_timeout=2)


@case
def rpc_server_that_answers_the_handshake_with_garbage(model: llamactx.LlamaModel) -> None:
    endpoint = fake_rpc.start([], hello=(5).to_bytes(8, "little") + b"hello")
    llamactx.LlamaModel.load_from_file(model.path, rpc_servers=[endpoint], rpc_timeout=2)


if __name__ == "__main__":
    harness.run(*CASES)
