"""What the second independent red team found (issue 27) could kill, hang or mislead the
process: each case prints ``RAISED`` and the name of the exception it raised (``none`` if it
returned), and ``tests/hostile/test_misuse_works_or_raises.py`` checks the name. A crash or a hang fails the test,
not pytest."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

import fake_rpc
import harness
import pytest

sys.path.append(str(Path(__file__).resolve().parents[2]))  # tests/, for the hostile constraints
from support.hostile_constraints import chained_lark, chained_schema

import llamactx
from llamactx._tools import plan

CASES: list[harness.Case] = []
case = harness.reporting(CASES)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
#: How many references (and Lark lines) a constraint may hold (crates/llamactx-engine/src/sampler/guidance.rs).
LINKS = 20_000


# 1. Recursion in constraint compilers: a chain that overflowed an 8 MiB stack compiles, and
# generation under it works, on any thread.


@case
def schema_chaining_3000_definitions(model: llamactx.LlamaModel) -> None:
    value = llamactx.generate_json(model.new_context(n_ctx=256), "Answer:", chained_schema(3000), max_tokens=8)
    assert value is None or isinstance(value, list), value


@case
def schema_chaining_3000_definitions_from_a_small_thread_stack(model: llamactx.LlamaModel) -> None:
    threading.stack_size(256 * 1024)
    failures: list[BaseException] = []

    def compile_schema() -> None:
        try:
            llamactx.LlamaSampler.llguidance(model, "json_schema", json.dumps(chained_schema(3000)))
        except BaseException as error:
            failures.append(error)

    worker = threading.Thread(target=compile_schema)
    worker.start()
    worker.join()
    if failures:
        raise failures[0]


@case
def tool_parameters_chaining_3000_definitions(model: llamactx.LlamaModel) -> None:
    # The tools' text fills any prompt: the reply's constraint is compiled alone here.
    tool = {"type": "function", "function": {"name": "deep", "parameters": chained_schema(3000)}}
    schema = plan(QUESTION, [tool], "required").schema
    llamactx.LlamaSampler.llguidance(model, "json_schema", json.dumps(schema))


@case
def schema_of_references_up_to_the_limit(model: llamactx.LlamaModel) -> None:
    # The deepest recursion per byte: each definition only names the next.
    schema = chained_schema(LINKS - 1, alias=True)
    llamactx.LlamaSampler.llguidance(model, "json_schema", json.dumps(schema))


@case
def schema_past_the_limit(model: llamactx.LlamaModel) -> None:
    llamactx.LlamaSampler.llguidance(model, "json_schema", json.dumps(chained_schema(LINKS + 1)))


@case
def lark_of_5000_chained_rules(model: llamactx.LlamaModel) -> None:
    llamactx.LlamaSampler.llguidance(model, "lark", chained_lark(5000))


@case
def lark_of_chained_rules_up_to_the_limit(model: llamactx.LlamaModel) -> None:
    llamactx.LlamaSampler.llguidance(model, "lark", chained_lark(LINKS - 3))


@case
def lark_past_the_limit(model: llamactx.LlamaModel) -> None:
    llamactx.LlamaSampler.llguidance(model, "lark", chained_lark(LINKS))


# 2. A hostile RPC server: answers whose values llama.cpp would act on unchecked.


def load_over_rpc(model: llamactx.LlamaModel, answer: bytes) -> None:
    endpoint = fake_rpc.start([answer])
    llamactx.LlamaModel.load_from_file(model.path, rpc_servers=[endpoint], rpc_timeout=2)


@case
def rpc_server_reporting_four_billion_devices(model: llamactx.LlamaModel) -> None:
    load_over_rpc(model, (4).to_bytes(8, "little") + (0xFFFFFFFF).to_bytes(4, "little"))


@case
def rpc_server_reporting_no_device(model: llamactx.LlamaModel) -> None:
    load_over_rpc(model, (4).to_bytes(8, "little") + bytes(4))


# 3. An ambiguous grammar written from a tool's schema, for a template's own tool-call format:
# llama.cpp's engine kept 3**n stacks after n "[" (seconds a token by the 8th).

TOOL_TEMPLATE = (Path(__file__).resolve().parents[1] / "templates" / "chatml_tools.jinja").read_text()


@case
def tool_schema_whose_grammar_is_ambiguous(model: llamactx.LlamaModel) -> None:
    nested = [
        {"type": "array", "prefixItems": [{"$ref": "#/$defs/e"}, {"const": end}], "minItems": 2, "maxItems": 2}
        for end in "bcd"
    ]
    schema = {
        "$defs": {"e": {"anyOf": [*nested, {"const": "z"}]}},
        "type": "object",
        "properties": {"e": {"$ref": "#/$defs/e"}},
        "required": ["e"],
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    call = model.str_to_token('Sure. <tool_call>\n{"name": "f", "arguments": {"e": ' + "[" * 200, False)
    ctx = model.new_context(n_ctx=64)
    batch = llamactx.LlamaBatch(1)
    batch.add(call[0], 0, [0], True)
    ctx.decode(batch)
    with llamactx.Engine(model, n_ctx=1024, n_seq_max=1, chat_template=TOOL_TEMPLATE) as engine:
        for choice in ("auto", "required"):  # a lazy grammar, then an eager one
            sampler = engine.prepare_chat(QUESTION, tools=[tool], tool_choice=choice).sampler
            assert sampler is not None
            for token in call:
                sampler.accept(token)
            candidates = ctx.candidates_ith(-1)
            sampler.apply(candidates)
            allowed = {model.token_to_str(int(token), True) for token in candidates.ids[candidates.logits > -1e30]}
            assert {"[", '"'} <= allowed, allowed


# 5. Templates without a work limit: llama.cpp's Jinja engine rendered a loop of ten million
# for minutes, uninterruptibly; now each call stops at a work limit (src/work_limit.rs).

LOOPING = [{"role": "user", "content": "loop"}]
#: A template that renders chats as ChatML, but loops for a first message "loop" (ten billion
#: times, freeing as it goes: stopped, it has little to clean up).
LOOPS_FOR_ONE_MESSAGE = (
    '{% if messages[0].content == "loop" %}'
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
)


@case
def template_looping_ten_million_times(model: llamactx.LlamaModel) -> None:
    started = time.perf_counter()
    try:
        with llamactx.Engine(model, n_ctx=256, chat_template="{% for i in range(10000000) %}x{% endfor %}") as engine:
            engine.chat_tokens(QUESTION)
    finally:
        assert time.perf_counter() - started < 10


@case
def template_looping_for_one_message(model: llamactx.LlamaModel) -> None:
    with llamactx.Engine(model, n_ctx=512, n_seq_max=1, chat_template=LOOPS_FOR_ONE_MESSAGE) as engine:
        with pytest.raises(llamactx.ChatTemplateError) as refused:
            engine.chat_tokens(LOOPING)
        assert refused.value.kind == "WorkLimit", refused.value
        assert engine.submit_chat(QUESTION, max_tokens=4).result().text


@case
def template_interrupted_by_ctrl_c(model: llamactx.LlamaModel) -> None:
    with llamactx.Engine(model, n_ctx=512, n_seq_max=1, chat_template=LOOPS_FOR_ONE_MESSAGE) as engine:
        engine.chat_tokens(QUESTION)  # parses the template
        started = time.perf_counter()
        with pytest.raises(llamactx.ChatTemplateError):
            engine.chat_tokens(LOOPING)
        until_the_limit = time.perf_counter() - started
        sent = harness.press_ctrl_c_soon(until_the_limit / 4)
        with pytest.raises(KeyboardInterrupt):
            engine.chat_tokens(LOOPING)
        # Raised by the render itself, soon after the signal and well before the limit.
        ended = time.perf_counter()
        assert sent
        assert ended - sent[0] < until_the_limit / 4, (ended - sent[0], until_the_limit)


#: A template that loops as often as its variable ``n`` says (``chat_template_kwargs``).
LOOPS_BY_A_VARIABLE = (
    "{% for i in range(n) %}{% for j in range(n) %}{% endfor %}{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
)


@case
def template_variables_nested_deeply(model: llamactx.LlamaModel) -> None:
    """Template variables are JSON a client sends: nested past serde_json's depth (128) they are
    refused before llama.cpp's recursive parser sees them, at any depth, and the engine goes on."""
    templates = llamactx._llamactx._ChatTemplates(model, LOOPS_BY_A_VARIABLE)
    for depth in (200, 100_000):
        nested = '{"n": 1, "deep": ' + "[" * depth + "]" * depth + "}"
        with pytest.raises(ValueError, match="chat_template_kwargs must be a JSON object"):
            templates.apply(json.dumps(QUESTION), "[]", "none", False, nested)
    assert templates.apply(json.dumps(QUESTION), "[]", "none", False, '{"n": 1}').tokens()


@case
def template_looping_as_a_variable_says(model: llamactx.LlamaModel) -> None:
    """A request's variable that makes the template loop ten billion times stops at the work
    limit, as a template's own loop does."""
    with llamactx.Engine(model, n_ctx=512, n_seq_max=1, chat_template=LOOPS_BY_A_VARIABLE) as engine:
        with pytest.raises(llamactx.ChatTemplateError) as refused:
            engine.prepare_chat(QUESTION, chat_template_kwargs={"n": 100_000})
        assert refused.value.kind == "WorkLimit", refused.value
        assert engine.submit_chat(QUESTION, max_tokens=4, chat_template_kwargs={"n": 1}).result().text


# 6, 7, 9. Waiting for one request in several ways at once.


@case
def request_awaited_from_two_event_loops(model: llamactx.LlamaModel) -> None:
    with llamactx.Engine(model, n_ctx=512, n_seq_max=2) as engine:
        request = engine.submit("The capital of France is", max_tokens=16)
        texts: list[str] = []

        def await_it() -> None:
            texts.append(asyncio.run(asyncio.wait_for(_awaited(request), 60)).text)

        waiters = [threading.Thread(target=await_it) for _ in range(2)]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join()
        assert texts == [request.result().text] * 2, texts


async def _awaited(request: llamactx.Request) -> llamactx.Completion:
    return await request


@case
def request_iterated_from_two_threads(model: llamactx.LlamaModel) -> None:
    with llamactx.Engine(model, n_ctx=512, n_seq_max=2) as engine:
        for _ in range(5):
            request = engine.submit("Once upon a time", max_tokens=48)
            read: list[list[str]] = [[], []]

            def read_into(pieces: list[str], request: llamactx.Request = request) -> None:
                pieces.extend(request)
                assert request.done, "iteration ended before the request did"

            readers = [threading.Thread(target=read_into, args=(pieces,)) for pieces in read]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join()
            # Each piece went to one reader: together they hold the whole text.
            assert sum(len(pieces) for pieces in read) >= 1
            assert sorted("".join(read[0]) + "".join(read[1])) == sorted(request.result().text)


@case
def event_loops_awaiting_requests_keep_no_descriptors(model: llamactx.LlamaModel) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    with llamactx.Engine(model, n_ctx=256, n_seq_max=1) as engine:
        # Two descriptors leaked a run exhausted the 256 by the 128th; the count after the 200
        # runs (about 6 open without a leak) finds one leaked every three runs.
        for _ in range(200):
            asyncio.run(_awaited(engine.submit("Hi", max_tokens=1)))
    open_now = len(os.listdir("/proc/self/fd"))
    assert open_now < 64, open_now


@case
def result_of_a_request_inherited_by_a_fork(model: llamactx.LlamaModel) -> None:
    with llamactx.Engine(model, n_ctx=256, n_seq_max=1) as engine:
        request = engine.submit("Once upon a time", max_tokens=4000)
        child = os.fork()
        if child == 0:
            refused = 0
            for wait in (
                lambda: request.result(timeout=30),
                lambda: asyncio.run(_awaited(request)),
                lambda: list(request),
            ):
                try:
                    wait()
                except ValueError:
                    refused += 1
            os._exit(7 if refused == 3 else 1)
        _, status = os.waitpid(child, 0)
        request.cancel()
        assert os.WEXITSTATUS(status) == 7, status
        raise ValueError("the forked child's wait raised ValueError")


if __name__ == "__main__":
    harness.run(*CASES)
