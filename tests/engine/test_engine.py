"""The engine: many requests at once give what each would alone; cancellation, a full queue,
prompts that cannot fit, close, Ctrl-C and exit with requests in flight."""

from __future__ import annotations

import asyncio
import pickle
import resource
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from support import synthetic
from support.processes import run_child

import llamactx

N_SEQ = 8
N_CTX = N_SEQ * 256
# Small, so that long prompts are read over several steps while other requests generate.
N_BATCH = 64
QUESTIONS = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Write a haiku about the sea.",
    "Why is the sky blue? Explain in detail for a child who asks many questions.",
    "List the first five prime numbers.",
    "Who wrote Hamlet?",
    "Describe a cat.",
    "What is two plus two?",
]


def prompt(n: int) -> str:
    # Lengths from a few tokens to ~150, so long prompts are read in chunks beside running ones.
    return f"Question {n}: " + QUESTIONS[n % len(QUESTIONS)] * (1 + n % 5) + " Answer:"


def max_tokens(n: int) -> int:
    return 8 + (n * 7) % 40


def alone(model: llamactx.LlamaModel, text: str, limit: int) -> tuple[str, list[int]]:
    """Greedy text and tokens of one request on a context of its own, with the engine's options,
    decoded token by token here (not by the engine's step loop, which ``generate`` runs on) and
    detokenized by llama.cpp."""
    with model.new_context(n_ctx=N_CTX, n_seq_max=N_SEQ, n_batch=N_BATCH) as ctx:
        tokens = model.str_to_token(text, model.add_bos_token())
        history = list(tokens)
        llamactx.prefill(ctx, tokens, 0)
        sampler = llamactx.LlamaSampler.greedy()
        ids: list[int] = []
        for _ in range(limit):
            token = sampler.sample(ctx, -1)
            if model.is_eog_token(token):
                break
            ids.append(token)
            if len(ids) == limit:
                break
            batch = llamactx.LlamaBatch(1)
            batch.add(token, len(history), [0], True)
            ctx.decode(batch)
            history.append(token)
        return model.detokenize(ids), ids


@pytest.fixture(scope="module")
def references(model: llamactx.LlamaModel) -> list[tuple[str, list[int]]]:
    return [alone(model, prompt(n), max_tokens(n)) for n in range(32)]


@pytest.fixture
def engine(model: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    # Without prefix reuse, every request must equal `generate` token for token.
    with llamactx.Engine(model, n_ctx=N_CTX, n_seq_max=N_SEQ, n_batch=N_BATCH, prefix_cache=False) as engine:
        yield engine
    assert engine.stats().running == 0


def wait_for(condition: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def test_32_requests_from_8_threads_equal_each_alone(
    engine: llamactx.Engine, references: list[tuple[str, list[int]]]
) -> None:
    results: dict[int, llamactx.Completion] = {}

    def client(first: int) -> None:
        requests = {n: engine.submit(prompt(n), max_tokens=max_tokens(n)) for n in range(first, 32, 8)}
        for n, request in requests.items():
            results[n] = request.result(timeout=300)

    threads = [threading.Thread(target=client, args=(first,)) for first in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == list(range(32))
    for n, (text, tokens) in enumerate(references):
        assert (results[n].text, results[n].tokens) == (text, tokens), f"request {n}"
        assert results[n].finish_reason == ("length" if len(tokens) == max_tokens(n) else "stop")
        assert results[n].prompt_tokens == len(engine.model.str_to_token(prompt(n), True))
    assert len({text for text, _ in references}) > 8
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.kv_cells_used) == (0, 0, 0)
    assert stats.tokens_generated == sum(c.completion_tokens for c in results.values())


def test_16_requests_from_asyncio_equal_each_alone(
    engine: llamactx.Engine, references: list[tuple[str, list[int]]]
) -> None:
    """Half streamed and half awaited, all at once: twice the engine's sequences (the first 16
    prompts, of every length the 32 have; the threads' test sends all 32)."""

    async def streamed(n: int) -> str:
        return "".join([piece async for piece in engine.submit(prompt(n), max_tokens=max_tokens(n))])

    async def main() -> tuple[list[str], list[llamactx.Completion]]:
        return await asyncio.gather(
            asyncio.gather(*(streamed(n) for n in range(N_SEQ))),
            asyncio.gather(*(engine.submit(prompt(n), max_tokens=max_tokens(n)) for n in range(N_SEQ, 2 * N_SEQ))),
        )

    texts, completions = asyncio.run(main())
    assert texts == [text for text, _ in references[:N_SEQ]]
    assert [(c.text, c.tokens) for c in completions] == references[N_SEQ : 2 * N_SEQ]


def test_blocking_iteration_yields_the_completion_text(engine: llamactx.Engine) -> None:
    request = engine.submit("Count: one, two, three,", max_tokens=30)
    pieces = list(request)
    completion = request.result()
    assert "".join(pieces) == completion.text
    assert len(pieces) > 1
    assert completion.completion_tokens >= len(completion.tokens) > 0
    assert completion.first_token_seconds is not None
    assert completion.first_token_seconds >= completion.queue_seconds
    assert completion.tokens_per_second > 0


def test_deltas_carry_the_logprobs_of_their_tokens(engine: llamactx.Engine) -> None:
    request = engine.submit("Count: one, two, three,", max_tokens=20, logprobs=2)
    deltas = list(request.deltas())
    completion = request.result()
    assert "".join(text for text, _ in deltas) == completion.text
    assert [entry for _, logprobs in deltas for entry in logprobs] == completion.logprobs

    async def streamed() -> list[llamactx.Delta]:
        return [delta async for delta in engine.submit("Count: one, two, three,", max_tokens=20, logprobs=2).adeltas()]

    assert asyncio.run(streamed()) == deltas
    assert all(logprobs == [] for _, logprobs in engine.submit("Hi", max_tokens=4).deltas())


def test_prompt_tokens_and_the_sequence_size(engine: llamactx.Engine, model: llamactx.LlamaModel) -> None:
    assert engine.tokens("Hello") == model.str_to_token("Hello", model.add_bos_token())
    assert engine.tokens([1, 2, 3]) == [1, 2, 3]
    messages = [{"role": "user", "content": "Hi"}]
    rendered = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert engine.chat_tokens(messages) == model.str_to_token(rendered, False)
    assert engine.n_ctx_seq == N_CTX // N_SEQ
    with pytest.raises(ValueError, match=f"holds {N_CTX // N_SEQ}"):
        engine.submit([1] * engine.n_ctx_seq)


def test_seeded_sampling_does_not_depend_on_what_else_runs(engine: llamactx.Engine) -> None:
    sampling = llamactx.SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    alone = engine.submit(prompt(0), max_tokens=24, sampling=sampling).result().text
    crowd = [engine.submit(prompt(n), max_tokens=30, sampling=llamactx.SamplingParams(seed=n)) for n in range(1, 6)]
    again = engine.submit(prompt(0), max_tokens=24, sampling=sampling)
    assert again.result().text == alone
    other_seed = llamactx.SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=99)
    assert engine.submit(prompt(0), max_tokens=24, sampling=other_seed).result().text != alone
    for request in crowd:
        request.result()


def test_greedy_requests_with_logit_bias_pick_what_llama_cpp_s_chain_picks(
    engine: llamactx.Engine, model: llamactx.LlamaModel
) -> None:
    # The engine picks greedy tokens from the logits itself, without llama.cpp's sampler chain.
    # The end of generation is banned throughout: the x86-64-v2 build's greedy reply is empty.
    no_end = {token: float("-inf") for token in range(model.n_vocab()) if model.is_eog_token(token)}
    greedy = llamactx.SamplingParams(temperature=0, logit_bias=no_end)
    plain = engine.submit(prompt(1), max_tokens=12, sampling=greedy).result()
    bias = {**no_end, plain.tokens[0]: float("-inf"), plain.tokens[3]: 2.5}
    sampling = llamactx.SamplingParams(temperature=0, logit_bias=bias)
    biased = engine.submit(prompt(1), max_tokens=12, sampling=sampling).result()
    with model.new_context(n_ctx=N_CTX, n_seq_max=N_SEQ, n_batch=N_BATCH) as ctx:
        expected = llamactx.generate(ctx, prompt(1), max_tokens=12, sampler=sampling.sampler(model))
        ban_all = llamactx.SamplingParams(temperature=0, logit_bias=dict.fromkeys(range(model.n_vocab()), -np.inf))
        with pytest.raises(llamactx.ShimError, match="no candidate is left") as by_chain:
            llamactx.generate(ctx, prompt(1), max_tokens=4, sampler=ban_all.sampler(model))
    assert biased.text == expected
    assert plain.tokens[0] not in biased.tokens
    assert biased.text != plain.text
    with pytest.raises(llamactx.ShimError) as by_engine:
        engine.submit(prompt(1), max_tokens=4, sampling=ban_all).result()
    assert str(by_engine.value) == str(by_chain.value)


def test_stop_strings_and_limits(engine: llamactx.Engine, model: llamactx.LlamaModel) -> None:
    with model.new_context(n_ctx=N_CTX, n_seq_max=N_SEQ, n_batch=N_BATCH) as ctx:
        expected = llamactx.generate(ctx, "One, two, three,", max_tokens=20, stop=[" five"])
    completion = engine.submit("One, two, three,", max_tokens=20, stop=" five").result()
    assert completion.text == expected
    assert completion.finish_reason == "stop"
    empty = engine.submit("One, two,", max_tokens=0).result()
    assert (empty.text, empty.tokens, empty.finish_reason, empty.completion_tokens) == ("", [], "length", 0)


def test_cancelling_frees_the_sequence(engine: llamactx.Engine) -> None:
    request = engine.submit("Count: one, two, three,", max_tokens=500)
    pieces = iter(request)
    next(pieces)
    request.cancel()
    completion = request.result(timeout=60)
    assert completion.finish_reason == "cancelled"
    assert 0 < len(completion.tokens) < 500
    wait_for(lambda: engine.stats().running == 0)
    assert engine.stats().kv_cells_used == 0


def test_cancelling_the_asyncio_task_cancels_the_request(engine: llamactx.Engine) -> None:
    async def main() -> llamactx.Request:
        request = engine.submit("Count: one, two, three,", max_tokens=500)

        async def consume() -> None:
            async for _ in request:
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return request

    request = asyncio.run(main())
    assert request.result(timeout=60).finish_reason == "cancelled"


def test_a_full_queue_raises_engine_busy_and_running_requests_go_on(model: llamactx.LlamaModel) -> None:
    with llamactx.Engine(model, n_ctx=512, n_seq_max=1, max_waiting=2) as engine:
        running = engine.submit("Count: one, two, three,", max_tokens=200)
        wait_for(lambda: engine.stats().running == 1)
        waiting = [engine.submit("One, two,", max_tokens=4) for _ in range(2)]
        with pytest.raises(llamactx.EngineBusy, match="max_waiting"):
            engine.submit("One, two,", max_tokens=4)
        assert engine.stats().waiting == 2
        assert running.result(timeout=120).finish_reason == "length"
        assert [request.result(timeout=60).finish_reason for request in waiting] == ["length", "length"]


def test_requests_that_cannot_run_are_refused_at_submit(engine: llamactx.Engine, model: llamactx.LlamaModel) -> None:
    with pytest.raises(ValueError, match=r"the prompt has 300 tokens; a sequence holds 256"):
        engine.submit([1] * 300)
    with pytest.raises(ValueError, match="no tokens"):
        engine.submit([])
    with pytest.raises(ValueError, match="token id"):
        engine.submit([model.n_vocab()])
    with pytest.raises(ValueError, match="max_tokens"):
        engine.submit("Hi", max_tokens=-1)
    with pytest.raises(ValueError, match="logit_bias"):
        engine.submit("Hi", sampling=llamactx.SamplingParams(logit_bias={model.n_vocab(): 1.0}))
    assert engine.stats().waiting == 0


def test_sampling_params_pickle() -> None:
    params = llamactx.SamplingParams(temperature=0.5, top_k=7, logit_bias={3: -1.5}, seed=42)
    copied = pickle.loads(pickle.dumps(params))
    assert repr(copied) == repr(params)
    assert repr(pickle.loads(pickle.dumps(llamactx.SamplingParams()))) == repr(llamactx.SamplingParams())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"penalty_last_n": 1 << 21}, "penalty_last_n"),
        ({"repeat_penalty": float("inf")}, "repeat_penalty"),
        ({"logit_bias": {5: float("nan")}}, "NaN"),
        ({"seed": 2**32 - 1}, "random"),
    ],
)
def test_sampling_params_refuse_bad_values(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        llamactx.SamplingParams(**arguments)  # type: ignore[arg-type]


def test_close_ends_every_request_in_flight(model: llamactx.LlamaModel) -> None:
    engine = llamactx.Engine(model, n_ctx=1024, n_seq_max=2)
    requests = [engine.submit("Count: one, two, three,", max_tokens=400) for _ in range(5)]
    wait_for(lambda: engine.stats().running == 2)
    engine.close()
    assert {request.result(timeout=10).finish_reason for request in requests} == {"cancelled"}
    assert all(request.done for request in requests)
    with pytest.raises(ValueError, match="closed"):
        engine.submit("Hi")
    engine.close()  # twice is fine


@pytest.mark.long
def test_1000_submit_cancel_cycles_from_4_threads_leave_nothing_behind(model: llamactx.LlamaModel) -> None:
    with llamactx.Engine(model, n_ctx=1024, n_seq_max=4) as engine:

        def cycles(count: int) -> None:
            for n in range(count):
                # A quarter run to their end: two tokens end them as well as eight. A prompt of
                # its number alone (one to three tokens): what is read costs, not what it says
                # (400 cycles took 8.5 s with "Say {n} and more:", 4.5 s so).
                request = engine.submit(str(n), max_tokens=8 if n % 4 else 2)
                if n % 4 == 1:
                    next(iter(request), None)  # cancelled while it runs
                if n % 4:
                    request.cancel()  # n % 4 > 1: mostly before it runs
                request.result(timeout=60)

        cycles(20)  # warm up allocations before measuring
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        threads = [threading.Thread(target=cycles, args=(250,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        stats = engine.stats()
        assert (stats.running, stats.waiting, stats.kv_cells_used) == (0, 0, 0)
        assert grown_mb < 20


def test_ctrl_c_while_waiting_on_a_request(model_path: Path) -> None:
    result = run_child(model_path, "engine_exit", "ctrl_c_while_waiting")
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = result.stdout.split("RESULT ", 1)[1].split()
    assert outcome[0] == "interrupted", "400 tokens took under 0.5 s?"
    assert float(outcome[1]) < 250
    assert outcome[2] == "cancelled"
    assert "AFTER length" in result.stdout


def test_the_interpreter_exits_while_a_thread_waits_on_a_request(model_path: Path) -> None:
    result = run_child(model_path, "engine_exit", "exit_while_a_thread_waits", timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["EXITING", "ENDED", "cancelled"]


def test_a_forked_child_is_refused_the_parents_engine(model_path: Path) -> None:
    result = run_child(model_path, "engine_exit", "submit_after_fork", timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["CHILD", "refused", "True", "PARENT", "length"]


SYSTEM = "You are a careful assistant. Answer briefly and politely, in plain words. " * 6


def test_a_shared_prompt_start_is_read_once(model: llamactx.LlamaModel) -> None:
    first_prompt = model.str_to_token(SYSTEM + "Question: what is water?", True)
    second_prompt = model.str_to_token(SYSTEM + "Question: what is fire?", True)
    shared = next(i for i, (a, b) in enumerate(zip(first_prompt, second_prompt, strict=False)) if a != b)
    with llamactx.Engine(model, n_ctx=1024, n_seq_max=2, n_batch=N_BATCH) as engine:
        first = engine.submit(first_prompt, max_tokens=12).result()
        second = engine.submit(second_prompt, max_tokens=12).result()
        stats = engine.stats()
    assert (first.cached_tokens, second.cached_tokens) == (0, shared)
    assert stats.prefix_cache_hits == 1
    assert stats.kv_cells_cached > 0
    assert stats.prompt_tokens_computed == len(first_prompt) + len(second_prompt) - shared
    # The same cells, computed by hand: the first prompt in the engine's chunks, cut back to the
    # shared start, then the rest of the second prompt.
    with model.new_context(n_ctx=1024, n_seq_max=2, n_batch=N_BATCH) as ctx:
        llamactx.prefill(ctx, first_prompt, 0)
        ctx.clear_kv_cache_seq(0, shared, None)
        llamactx.prefill(ctx, second_prompt, 0, start=shared)
        history = list(second_prompt)
        expected = "".join(
            llamactx.continue_sequence(ctx, history, max_tokens=12, sampler=llamactx.LlamaSampler.greedy())
        )
    assert second.text == expected


def test_a_running_request_shares_its_cells(model: llamactx.LlamaModel) -> None:
    question = SYSTEM + "Question: what is fire?"
    with llamactx.Engine(model, n_ctx=1024, n_seq_max=2, n_batch=N_BATCH) as engine:
        engine.submit(SYSTEM + "Question: what is water?", max_tokens=1).result()
        after_it_ended = engine.submit(question, max_tokens=12).result()
    with llamactx.Engine(model, n_ctx=1024, n_seq_max=2, n_batch=N_BATCH) as engine:
        running = engine.submit(SYSTEM + "Question: what is water?", max_tokens=400)
        next(iter(running))  # it has read its prompt and generates
        while_it_runs = engine.submit(question, max_tokens=12).result()
        running.cancel()
    assert while_it_runs.cached_tokens == after_it_ended.cached_tokens > 0
    assert while_it_runs.text == after_it_ended.text


def test_logprobs_follow_the_models_distribution(engine: llamactx.Engine, model: llamactx.LlamaModel) -> None:
    completion = engine.submit("The capital of France is", max_tokens=6, logprobs=3).result()
    assert len(completion.logprobs) == len(completion.tokens) == 6
    for token, alternatives in zip(completion.tokens, completion.logprobs, strict=True):
        assert alternatives[0][0] == token
        assert len({pair[0] for pair in alternatives}) == 4
        # Greedy: the chosen token is the most likely one.
        assert alternatives[0][1] >= max(logprob for _, logprob in alternatives[1:])
    with model.new_context(n_ctx=N_CTX, n_seq_max=N_SEQ, n_batch=N_BATCH) as ctx:
        llamactx.prefill(ctx, model.str_to_token("The capital of France is", True), 0)
        logits = ctx.get_logits_ith(-1).astype(np.float64)
    log_softmax = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    for token, logprob in completion.logprobs[0]:
        assert logprob == pytest.approx(log_softmax[token], abs=1e-4)
    assert engine.submit("Hi", max_tokens=2).result().logprobs == []
    with pytest.raises(ValueError, match="logprobs"):
        engine.submit("Hi", logprobs=21)


def test_a_grammar_constrains_one_request_and_not_the_others(engine: llamactx.Engine) -> None:
    grammar = 'root ::= ("yes" | "no") "."'
    constrained = engine.submit("Is the sky green? Answer:", max_tokens=20, grammar=grammar)
    free = engine.submit("Is the sky green? Answer:", max_tokens=20)
    completion = constrained.result()
    assert completion.text in {"yes.", "no."}
    assert completion.finish_reason == "stop"
    assert free.result().text not in {"yes.", "no."}
    with pytest.raises(llamactx.SamplerInitError):
        engine.submit("Hi", grammar="root ::= (")


def test_models_the_engine_cannot_run_are_refused(tiny_bert_path: Path) -> None:
    bert = llamactx.LlamaModel.load_from_file(tiny_bert_path)
    with pytest.raises(ValueError, match="no KV cache"):
        llamactx.Engine(bert, n_ctx=synthetic.BERT_CONTEXT, n_seq_max=2)  # within its learned positions


def test_a_request_arriving_while_a_prompt_is_read_is_read_before_the_next_step(
    model: llamactx.LlamaModel,
) -> None:
    """A short request that arrives while a long prompt is read is read right after it, so its
    first token comes before the running request's next token (not a whole step later)."""
    long_prompt = (model.str_to_token(SYSTEM * 40, True))[:500]  # about 3 s to read here
    with llamactx.Engine(model, n_ctx=3 * 1536, n_seq_max=3, n_batch=2048) as engine:
        running = engine.submit("Count: one, two, three,", max_tokens=2000)
        running_pieces: list[float] = []

        def read_running() -> None:
            for _ in running:
                running_pieces.append(time.monotonic())

        reader = threading.Thread(target=read_running)
        reader.start()
        wait_for(lambda: len(running_pieces) > 2)
        long = engine.submit(long_prompt, max_tokens=1)
        time.sleep(0.05)  # its prompt is being read (seconds on a CPU)
        short_submitted = time.monotonic()
        short = engine.submit("Count: one, two,", max_tokens=1)
        next(iter(short))
        short_first_token = time.monotonic()
        running.cancel()
        reader.join()
        assert long.result(timeout=60).finish_reason == short.result(timeout=60).finish_reason == "length"
    running_next = min(piece for piece in running_pieces if piece > short_submitted)
    assert short_first_token < running_next
