"""Property-based fuzzing of the API: random programs of calls with random and hostile
arguments against one context on the real model. Runs as a child process (see test_fuzz.py):
every call is printed before it runs, so if llama.cpp crashes the process, the parent reports
the call. A call may return or raise one of the documented exceptions; anything else (a panic,
an internal error, a crash) fails.

    python tests/support/children/fuzz.py MODEL_PATH EXAMPLES
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import struct
import sys
import tempfile
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llamactx

sys.path.append(str(Path(__file__).resolve().parents[2]))  # tests/, for the GGUF writers
import fake_rpc
from support import audio, images, no_network, synthetic
from support.hostile_constraints import chained_lark, chained_schema, doubling_one_of, wide_schema

# No call may open a connection (a schema's reference once made the check fetch it): one that
# tries raises PermissionError, an exception no call documents.
no_network.install()

# RuntimeError: a callback that calls back into the context it runs in.
ALLOWED = (llamactx.LlamaCppError, ValueError, IndexError, TypeError, OverflowError, FileNotFoundError, RuntimeError)
N_SEQ = 3
# Two compute threads where the process may use two CPUs (make test's serial pass, ``make
# fuzz``); one in a parallel test worker, which keeps to one CPU (``tests/conftest.py``).
THREADS = min(2, len(os.sched_getaffinity(0)))

model = llamactx.LlamaModel.load_from_file(sys.argv[1])
N_VOCAB = model.n_vocab()
ctx = model.new_context(n_ctx=256, n_batch=32, n_ubatch=16, n_seq_max=N_SEQ, n_threads=THREADS)
# A K cache type the CPU cannot shift, for the shift operations.
bf16_ctx = model.new_context(n_ctx=256, n_batch=32, cache_type_k="bf16", n_threads=THREADS)
batches = [llamactx.LlamaBatch(32, 2), llamactx.LlamaBatch(4, 1)]
# A small engine: requests with hostile arguments, while the context above is used.
ENGINE_OPTIONS: dict[str, Any] = {
    "n_ctx": 256,
    "n_seq_max": 2,
    "n_batch": 32,
    "n_threads": 1,
    "n_threads_batch": 1,
    "max_waiting": 4,
}
engine = llamactx.Engine(model, **ENGINE_OPTIONS)
# Engines that draft at every step: by n-gram lookup, and with the model as its own draft model.
engines = [
    engine,
    llamactx.Engine(model, speculative=llamactx.NgramDraft(1, 4, only_where_faster=False), **ENGINE_OPTIONS),
    llamactx.Engine(model, speculative=llamactx.DraftModel(model, 4, 0.0, only_where_faster=False), **ENGINE_OPTIONS),
]
# For `embed`: texts and token ids, as the server's /v1/embeddings takes them.
embedder = llamactx._embedding.embedding_context(model, 2, 32, 1)
# SmolLM2 has no classification head: RANK pooling scores a pair by its last hidden state's first value.
ranker = llamactx._embedding.embedding_context(model, 2, 32, 1, llamactx.LlamaPoolingType.RANK)
# A synthetic projector, for images of any bytes, into the context above.
PROJECTOR_FOLDER = tempfile.TemporaryDirectory()
mtmd = llamactx.MtmdContext(
    model, synthetic.write_tiny_projector(Path(PROJECTOR_FOLDER.name) / "mmproj.gguf", model.n_embd()), n_threads=1
)

hostile_ints = st.sampled_from([-(2**63), -(2**31) - 1, -(2**31), -2, -1, 2**31 - 1, 2**31, 2**32, 2**40, 2**63 - 1])
small_ints = st.integers(-3, 40)
ints = st.one_of(small_ints, small_ints, hostile_ints)
tokens = st.one_of(st.integers(0, N_VOCAB - 1), st.integers(0, N_VOCAB - 1), ints, st.just(N_VOCAB))
seqs = st.one_of(st.integers(0, N_SEQ), ints)
positions = st.one_of(st.none(), small_ints, hostile_ints)
token_lists = st.lists(tokens, max_size=12)
#: A reranker's inputs: any text, with special-token text and the template's placeholders.
rerank_texts = st.lists(
    st.one_of(st.text(max_size=12), st.sampled_from(["<|im_end|>", "<|im_start|>", "{query}", "{document}", "\x00"])),
    max_size=4,
).map("".join)
blobs = st.one_of(st.binary(max_size=64), st.just(b""))
engine.submit("Hello there", max_tokens=2).result()
#: A slot file of the engine's, cut, extended and with a byte changed.
SLOT_FILE = engine.save_slots()[0]
slot_files = st.one_of(
    blobs,
    st.integers(0, len(SLOT_FILE)).map(lambda end: SLOT_FILE[:end]),
    st.binary(max_size=16).map(lambda tail: SLOT_FILE + tail),
    st.tuples(st.integers(0, len(SLOT_FILE) - 1), st.integers(1, 255)).map(
        lambda change: SLOT_FILE[: change[0]] + bytes([SLOT_FILE[change[0]] ^ change[1]]) + SLOT_FILE[change[0] + 1 :]
    ),
)


# Temperatures so small that dividing the logits by them overflows, too (issue 27).
SAMPLING_FLOATS = st.sampled_from([0.0, 0.5, 1.0, 1.5, -1.0, float("inf"), float("nan"), 1e30, 1e-40, 1e-45, 5e-7])
sampling_params = st.fixed_dictionaries(
    {},
    optional={
        "temperature": SAMPLING_FLOATS,
        "top_k": ints,
        "top_p": SAMPLING_FLOATS,
        "min_p": SAMPLING_FLOATS,
        "typical_p": SAMPLING_FLOATS,
        "repeat_penalty": SAMPLING_FLOATS,
        "penalty_last_n": ints,
        "logit_bias": st.dictionaries(tokens, SAMPLING_FLOATS, max_size=3),
        "seed": st.one_of(st.none(), small_ints, hostile_ints),
    },
)


def engine_request(
    which: int,
    prompt: str | list[int],
    max_tokens: int,
    stop: list[str],
    sampling: dict[str, Any] | None,
    logprobs: int,
    grammar: str | None,
) -> None:
    """One request to ``engines[which]``; long ones are cancelled at once, so an example stays
    short."""
    params = None if sampling is None else llamactx.SamplingParams(**sampling)
    request = engines[which].submit(
        prompt, max_tokens=max_tokens, stop=stop, sampling=params, logprobs=logprobs, grammar=grammar
    )
    if max_tokens > 8:
        request.cancel()
    else:
        for _text, _logprobs in request.deltas():  # the streamed pieces and their logprobs
            pass
    request.result(timeout=120)


def speculative_generation(
    kind: str, size: int, p_min: float, prompt: str | list[int], max_tokens: int, stop: list[str], seq: int
) -> None:
    """``generate`` on the context with drafts of any size (the options checked)."""
    draft: llamactx.NgramDraft | llamactx.DraftModel = (
        llamactx.NgramDraft(1, size, only_where_faster=False)
        if kind == "ngram"
        else llamactx.DraftModel(model, size, p_min, only_where_faster=False)
    )
    llamactx.generate(ctx, prompt, max_tokens=max_tokens, stop=stop, seq_id=seq, speculative=draft)


def continued_sequence(history: list[int], max_tokens: int, seq: int, drafts: bool, stop: list[str]) -> None:
    """``continue_sequence`` called directly, as a caller that keeps its own history would: the
    history any ids (outside the vocabulary, or not what the sequence holds), the sequence any
    id, drafts or none; the caller's context may hold anything from the program before."""
    draft = llamactx.NgramDraft(1, 3, only_where_faster=False) if drafts else None
    pieces = llamactx.continue_sequence(
        ctx,
        history,
        max_tokens=max_tokens,
        sampler=llamactx.LlamaSampler.greedy(),
        stop=stop,
        seq_id=seq,
        speculative=draft,
    )
    for _piece in pieces:
        pass


def image_file_bytes(kind: str, width: int, height: int, colour: int, cut: int, noise: bytes) -> bytes:
    """Image and audio bytes of every sort: a valid PNG of any size and colour type or a WAV
    file of any length and rate (cut short by ``cut`` bytes when positive), a header claiming
    any size, or a signature followed by ``noise``."""
    if kind == "png":
        # Real pixels only for small images: the huge sizes are for the headers below.
        data = images.random_png(width % 81, height % 81, colour)
        return data[: len(data) - cut] if cut > 0 else data
    if kind == "png header":
        return images.png_header(width, height, colour) + noise
    if kind == "wav":
        data = audio.wav(audio.tone(440 + width, (height % 81) / 40, 8000 + 1000 * colour), 8000 + 1000 * colour)
        return data[: len(data) - cut] if cut > 0 else data
    signature = {
        "jpeg": b"\xff\xd8\xff",
        "gif": b"GIF89a",
        "bmp": b"BM",
        "wav header": b"RIFF\0\0\0\0WAVEfmt ",
        "raw": b"",
    }[kind]
    return signature + noise


def wav_with_fields(
    format_tag: int, channels: int, rate: int, bits: int, block_align: int, data_size: int, data: bytes
) -> bytes:
    """A WAV file whose header fields hold any values (format, channels, rate, bits per sample,
    block alignment, the size its data chunk claims) around ``data``."""
    fmt = struct.pack("<HHIIHH", format_tag, channels, rate, (rate * block_align) % 2**32, block_align, bits)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", data_size) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


wav_fields = st.builds(
    wav_with_fields,
    st.sampled_from([0, 1, 2, 3, 0xFFFE]),
    st.one_of(st.integers(0, 8), st.just(2**16 - 1)),
    st.one_of(st.sampled_from([0, 1, 8000, 16_000, 44_100, 768_000, 768_001]), st.integers(0, 2**32 - 1)),
    st.sampled_from([0, 7, 8, 16, 24, 32, 64, 2**16 - 1]),
    st.integers(0, 2**16 - 1),
    st.one_of(st.integers(0, 512), st.just(2**32 - 1)),
    st.binary(max_size=512),
)

image_data = st.one_of(
    wav_fields,
    st.builds(
        image_file_bytes,
        st.sampled_from(["png", "png", "png header", "jpeg", "gif", "bmp", "wav", "wav header", "raw"]),
        st.one_of(st.integers(0, 80), st.sampled_from([2**16, 2**31 - 1, 2**32 - 1])),
        st.one_of(st.integers(0, 80), st.sampled_from([2**16, 2**31 - 1])),
        st.sampled_from(sorted(images.PNG_CHANNELS)),
        st.integers(-4, 40),
        st.binary(max_size=64),
    ),
)


def image_into_context(data: bytes, max_pixels: int, text: str, n_past: int, seq: int) -> None:
    """Image bytes decoded, tokenized with text around them and evaluated anywhere."""
    bitmap = llamactx.MtmdBitmap.from_buf(data, max_pixels=max_pixels)
    chunks = mtmd.tokenize_from_parts([text, bitmap, text])
    mtmd.eval_chunks(ctx, chunks, n_past, seq)


def image_chat(data: bytes, text: str, url_scheme: str, copies: int, limits: tuple[int, int, float]) -> None:
    """A chat whose message holds the bytes as ``copies`` media parts (audio for a WAV file),
    under a media budget of any limits (out of range ones are a ``ValueError``)."""
    encoded = base64.b64encode(data).decode()
    part: dict[str, Any] = (
        {"type": "input_audio", "input_audio": {"data": encoded, "format": "wav"}}
        if data.startswith(b"RIFF")
        else {"type": "image_url", "image_url": {"url": f"{url_scheme}{encoded}"}}
    )
    parts = [part] * copies + [{"type": "text", "text": text}]
    budget = llamactx.MediaBudget(*limits)
    llamactx.chat(ctx, [{"role": "user", "content": parts}], max_tokens=2, mtmd=mtmd, media_budget=budget)


def reset() -> None:
    """Back to a plain context between examples (hostile calls may have changed settings)."""
    ctx.set_embeddings(False)
    ctx.set_causal_attn(True)
    ctx.set_warmup(False)
    ctx.set_abort_callback(None)
    ctx.set_n_threads(THREADS, THREADS)
    ctx.detach_threadpool()
    ctx.set_adapter_cvec(None, model.n_embd(), 0, 0)
    for seq in range(N_SEQ):
        ctx.set_sampler(seq, None)
    ctx.clear_kv_cache()
    for batch in batches:
        batch.clear()


def state_blob(mutation: int) -> bytes:
    data = ctx.state_get_data()
    return data[: mutation % (len(data) + 1)]


def flipped_state(at: int, bits: int) -> bytes:
    """This context's state with one byte changed (lengths, positions, cell counts...)."""
    data = bytearray(ctx.state_get_data())
    data[at % len(data)] ^= bits or 1
    return bytes(data)


GRAMMARS = ['root ::= "a"', 'root ::= [a-z]+ "."', 'root ::= "yes" | "no"']
#: Look-around openings among them reach the bounded backtracking engine; a back-reference is refused.
LOOK_AROUND = ["(?=", "(?!", "(?<=", "(?<!", "\\1"]
PATTERN_PIECES = st.sampled_from(
    ["(", ")", "[", "]", "a", "\\", "*", "+", "?", "|", "^", "$", ".", "{2}", "\\s", *LOOK_AROUND]
)
patterns = st.lists(PATTERN_PIECES, max_size=24).map("".join)

# JSON Schemas: small ones of every keyword llguidance reads, nested, plus hostile texts.
SCHEMA_LEAVES = st.sampled_from(
    [
        {"type": "string", "maxLength": 5},
        {"type": "string", "pattern": "^[a-c]{1,3}$"},
        {"type": "string", "format": "date"},
        {"type": "integer", "minimum": -3, "maximum": 2**40},
        {"type": "number", "multipleOf": 0.5},
        {"enum": ["a", 1, None]},
        {"const": "x"},
        {"type": ["null", "boolean"]},
        {"$ref": "#/$defs/missing"},
        {"$ref": "#"},
        # References outside the document: refused, never fetched (the port is closed anyway).
        {"$ref": "http://127.0.0.1:9/schema.json"},
        {"$dynamicRef": "http://127.0.0.1:9/schema.json#node"},
        {"$id": "http://127.0.0.1:9/root.json", "$recursiveRef": "other.json"},
        {"minimum": 5, "maximum": 3},
        {"not": {}},
        {"uniqueItems": True},
        True,
        False,
        {},
    ]
)
schemas = st.recursive(
    SCHEMA_LEAVES,
    lambda inner: st.one_of(
        st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, inner, hostile_ints | small_ints),
        st.builds(lambda items: {"prefixItems": items, "items": False}, st.lists(inner, max_size=3)),
        st.builds(
            lambda props: {
                "type": "object",
                "properties": props,
                "required": list(props),
                "additionalProperties": False,
            },
            st.dictionaries(st.text(max_size=4), inner, max_size=3),
        ),
        st.builds(lambda options: {"anyOf": options}, st.lists(inner, max_size=3)),
        st.builds(lambda options: {"oneOf": options}, st.lists(inner, max_size=3)),
        st.builds(lambda defs: {"$defs": {"node": defs}, "$ref": "#/$defs/node"}, inner),
    ),
    max_leaves=8,
)


# Schemas and grammars deep and wide, around the limits the compiler enforces (20,000 links).
deep_schemas = st.one_of(
    st.builds(chained_schema, st.sampled_from([10, 3000, 19_990, 20_001, 40_000]), alias=st.booleans()),
    # A check whose work doubles with each level: stopped by its budget (MAX_CHECK_STEPS).
    st.builds(doubling_one_of, st.sampled_from([4, 24])),
)
wide_schemas = st.builds(wide_schema, st.sampled_from([1, 200, 2000]), required=st.booleans())
deep_larks = st.builds(chained_lark, st.sampled_from([10, 5000, 19_990, 20_001]), st.sampled_from([1, 3]))
constraint_texts = st.one_of(
    schemas.map(json.dumps),
    st.text(max_size=30),
    patterns,
    st.sampled_from(GRAMMARS),
    deep_schemas.map(json.dumps),
    wide_schemas.map(json.dumps),
    deep_larks,
)
CONSTRAINT_KINDS = st.sampled_from(["json_schema", "lark", "regex", "gbnf", ""])
# OpenAI tools, well- and ill-formed.
tools = st.lists(
    st.one_of(
        st.builds(
            lambda name, params: {"type": "function", "function": {"name": name, "parameters": params}},
            st.sampled_from(["get_weather", "f", "", "get_weather"]),
            schemas,
        ),
        st.builds(dict, st.dictionaries(st.sampled_from(["type", "function"]), st.text(max_size=4), max_size=2)),
    ),
    max_size=3,
)
tool_choices = st.one_of(
    st.sampled_from(["auto", "none", "required", "sometimes"]),
    st.builds(lambda name: {"type": "function", "function": {"name": name}}, st.sampled_from(["get_weather", "g"])),
)
chat_messages = st.lists(
    st.one_of(
        st.builds(
            lambda role, content: {"role": role, "content": content},
            st.sampled_from(["user", "tool", "x"]),
            st.text(max_size=20),
        ),
        st.just(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{"}}],
            }
        ),
        st.just({"role": "user"}),
    ),
    max_size=4,
)
# Jinja templates: ChatML with tools, and pieces that break it or loop.
JINJA_PIECES = st.sampled_from(
    [
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
        "{% if tools %}{{ tools | tojson }}{% endif %}",
        "{% for c in messages[-1].tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}",
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        "{{ raise_exception('no') }}",
        "{{ messages[99].content }}",
        "{% for x in range(10**9) %}",
        # Loops and output past the work limit (src/work_limit.rs): each is stopped within it.
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{{ 'x' * 100000000 }}",
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
        "{{",
        "{% endfor %}",
        "{{ bos_token }}",
    ]
)
templates = st.lists(JINJA_PIECES, max_size=5).map("".join)
# Template variables (chat_template_kwargs): JSON objects of booleans, numbers and text, or any
# JSON text at all (an array, a string, nesting past the parser's depth), or none.
template_variables = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(["enable_thinking", "n", "greeting", ""]),
        st.one_of(st.booleans(), st.integers(-3, 3), st.text(max_size=8), st.none()),
        max_size=3,
    ).map(json.dumps),
    st.sampled_from(["[]", '"x"', "{", "{}" * 2, '{"a": ' + "[" * 300 + "]" * 300 + "}"]),
)


def constrained_generation(kind: str, text: str, prompt: str, seq: int) -> None:
    """A constraint of any kind and text, built, then sampled and fed hostile tokens."""
    # GBNF both ways: llama.cpp's own engine (LlamaSampler.grammar) and llguidance's.
    sampler = S.grammar(model, text) if kind == "gbnf" and seq % 2 else S.llguidance(model, kind, text)
    chained = S.chain([sampler, S.greedy()])
    llamactx.generate(ctx, prompt or "x", max_tokens=4, sampler=chained, seq_id=seq % N_SEQ)
    for token in (N_VOCAB - 1, 0, model.token_eos()):
        with contextlib.suppress(*ALLOWED):
            sampler.accept(token)
    sampler.reset()


def structured_request(schema: Any, tool_list: list[Any], choice: Any, messages: list[Any], max_tokens: int) -> None:
    """A chat request through the engine with a JSON Schema or tools; long ones are cancelled."""
    if tool_list:
        request = engine.submit_chat(messages, max_tokens=max_tokens, tools=tool_list, tool_choice=choice)
    else:
        request = engine.submit_chat(messages, max_tokens=max_tokens, json_schema=schema)
    if max_tokens > 8:
        request.cancel()
    request.message(timeout=120)


def prepared_chat(tool_list: list[Any], choice: Any, messages: list[Any], choices: int, schema: Any) -> None:
    """A chat rendered once and submitted as several choices (as the server does), with a
    constraint of its own that the tools may forbid; the requests are cancelled."""
    chat = engine.prepare_chat(messages, tools=tool_list, tool_choice=choice)
    requests = [engine.submit_prepared(chat, max_tokens=4, json_schema=schema) for _ in range(choices % 3 + 1)]
    for request in requests:
        request.cancel()
        chat.reply(request.result(timeout=120).text)


def template_chat(
    template: str,
    messages: list[Any],
    tool_list: list[Any],
    choice: str,
    parallel: bool,
    variables: str | None,
    reasoning_format: str,
    budget: int,
) -> None:
    """A Jinja chat template of any text, applied with any messages, tools, variables
    (``chat_template_kwargs``, any JSON text) and reasoning format, then parsed whole and as a
    stream's partial text, with a reasoning budget of any size."""
    applied = llamactx._llamactx._ChatTemplates(model, template).apply(
        json.dumps(messages), json.dumps(tool_list), choice, parallel, variables, reasoning_format
    )
    applied.tokens()
    sampler = applied.sampler()
    if sampler is not None:
        sampler.accept(0)
    reply = '<think>a</th<tool_call>\n{"name": "get_weather", "arguments": {'
    applied.parse(reply)
    applied.parse(reply, True)
    stage = applied.reasoning_budget(budget, "x")
    if stage is not None:
        stage.accept(0)


# One stage of a sampler chain, in any order (the chain may select nothing, or mask everything).
# Partials, so that the printed calls say which stages a failing chain held.
S = llamactx.LlamaSampler
stages = st.one_of(
    st.just(partial(S.greedy)),
    st.just(partial(S.dist, 0)),
    st.builds(partial, st.just(S.top_k), st.integers(-2, 60000)),
    st.builds(partial, st.just(S.top_p), st.floats(-0.5, 1.5), st.just(1)),
    st.builds(partial, st.just(S.min_p), st.floats(-0.5, 1.5), st.just(1)),
    st.builds(partial, st.just(S.temp), st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(
        partial,
        st.just(S.penalties),
        st.just(N_VOCAB),
        st.integers(-2, 2**21),
        st.just(1.3),
        st.just(0.1),
        st.just(0.1),
    ),
    st.builds(
        partial,
        st.just(S.logit_bias),
        st.just(N_VOCAB),
        st.tuples(st.integers(-2, 60000), st.just(2.0)).map(lambda b: [b]),
    ),
    st.builds(partial, st.just(S.grammar), st.just(model), st.sampled_from(GRAMMARS)),
    st.builds(partial, st.just(S.llguidance), st.just(model), CONSTRAINT_KINDS, constraint_texts),
    st.builds(
        partial,
        st.just(S.grammar_lazy_patterns),
        st.just(model),
        st.sampled_from(GRAMMARS),
        st.just("root"),
        patterns.map(lambda p: [p]),
        st.just([]),
    ),
)


CRAFTED_MODELS = {
    "bert": synthetic.write_tiny_bert,
    "t5": synthetic.write_tiny_t5,
    "mamba": synthetic.write_tiny_mamba,
    "hybrid": synthetic.write_tiny_hybrid,
}


def crafted_vocabulary(tokenizer: str, pieces: list[str], text: str) -> None:
    """A vocabulary-only GGUF of any pieces (duplicates, empty, huge) under any tokenizer, used."""
    with tempfile.TemporaryDirectory() as folder:
        path = synthetic.write_vocabulary(Path(folder) / "vocabulary.gguf", tokenizer, pieces)
        vocabulary = llamactx.LlamaModel.load_from_file(path, vocab_only=True)
    for call in (
        lambda: vocabulary.detokenize(vocabulary.str_to_token(text, True)),
        lambda: [vocabulary.token_to_bytes(token) for token in range(vocabulary.n_vocab())],
        lambda: llamactx.LlamaSampler.infill(vocabulary),
        lambda: llamactx.LlamaSampler.grammar(vocabulary, GRAMMARS[0]),
    ):
        with contextlib.suppress(*ALLOWED):
            call()


def crafted_model(kind: str, seed: int, options: dict[str, Any], ids: list[int], flip: tuple[int, int]) -> None:
    """A small model of another architecture (encoder-decoder, recurrent, hybrid, encoder) with
    any context options: encoded, decoded, and its state restored with a flipped byte."""
    with tempfile.TemporaryDirectory() as folder:
        path = CRAFTED_MODELS[kind](Path(folder) / "model.gguf", seed)
        crafted = llamactx.LlamaModel.load_from_file(path)
    context = crafted.new_context(n_ctx=64, n_batch=64, n_ubatch=64, **options)
    for run in (context.encode, context.decode, context.decode):
        batch = llamactx.LlamaBatch(len(ids) + 1, 2)
        with contextlib.suppress(*ALLOWED):
            batch.add_sequence(ids, 0, False)
            run(batch)
    state = bytearray(context.copy_state_data())
    if state:
        state[flip[0] % len(state)] ^= flip[1]
        context.set_state_data(bytes(state))


#: The projector keys clip reads, each with the GGUF type it asks for (a value of another type is
#: one of the hostile choices).
PROJECTOR_KEYS = {
    "clip.projector_type": gguf.GGUFValueType.STRING,
    "clip.vision.attention.head_count": gguf.GGUFValueType.UINT32,
    "clip.vision.attention.head_count_kv": gguf.GGUFValueType.UINT32,
    "clip.vision.embedding_length": gguf.GGUFValueType.UINT32,
    "clip.vision.block_count": gguf.GGUFValueType.UINT32,
    "clip.vision.image_size": gguf.GGUFValueType.UINT32,
    "clip.vision.patch_size": gguf.GGUFValueType.UINT32,
    "clip.vision.attention.layer_norm_epsilon": gguf.GGUFValueType.FLOAT32,
    "clip.vision.projector.scale_factor": gguf.GGUFValueType.UINT32,
    "clip.audio.projector.stack_factor": gguf.GGUFValueType.UINT32,
    "clip.audio.num_mel_bins": gguf.GGUFValueType.UINT32,
    "clip.audio.block_count": gguf.GGUFValueType.UINT32,
}
PROJECTOR_VALUES = st.one_of(
    st.integers(0, 70),
    st.sampled_from([2**31, 2**32 - 1]),
    st.sampled_from(["mlp", "idefics3", "gemma3", "qwen2vl_merger", "qwen2.5vl_merger", "ultravox", "minicpmv"]),
    st.sampled_from([float("nan"), -1.0, 1e-6, float("inf")]),
)


def crafted_projector(of_audio: bool, keys: dict[str, tuple[Any, bool]], dropped: list[int], reshaped: int) -> None:
    """The synthetic vision or audio projector with keys set to any value (of the type clip reads
    or another), tensors dropped, one tensor given another shape: loaded, then fed an image or a
    clip of its kind."""
    with tempfile.TemporaryDirectory() as folder:
        write = synthetic.write_tiny_audio_projector if of_audio else synthetic.write_tiny_projector
        base = write(Path(folder) / "base.gguf", model.n_embd())
        names = [tensor.name for tensor in gguf.GGUFReader(base).tensors]
        changed: dict[str, synthetic.KeyValue | None] = {}
        for key, (value, as_read) in keys.items():
            kind = PROJECTOR_KEYS[key] if as_read else gguf.GGUFValueType.STRING
            if kind == gguf.GGUFValueType.STRING:
                value = str(value)
            elif kind == gguf.GGUFValueType.FLOAT32:
                value = float(value) if not isinstance(value, str) else 0.5
            else:
                value = value if isinstance(value, int) else 3
            changed[key] = (value, kind)
        tensors: dict[str, np.ndarray | None] = {names[i % len(names)]: None for i in dropped}
        tensors[names[reshaped % len(names)]] = np.zeros((3, 5), np.float32)
        path = synthetic.rewrite_gguf(base, Path(folder) / "crafted.gguf", keys=changed, tensors=tensors)
        with contextlib.suppress(*ALLOWED), llamactx.MtmdContext(model, path, n_threads=1) as projector:
            media = audio.wav(audio.tone(440, 1.0)) if of_audio else images.random_png(64, 64, 2)
            chunks = projector.tokenize("<__media__> hi", [llamactx.MtmdBitmap.from_buf(media)])
            projector.eval_chunks(ctx, chunks, 0, 0)


def chain_of(made: list[Callable[[], llamactx.LlamaSampler]]) -> llamactx.LlamaSampler:
    return llamactx.LlamaSampler.chain([make() for make in made])


def sample_then_accept(made: list[Callable[[], llamactx.LlamaSampler]], i: int, extra: list[int]) -> None:
    sampler = chain_of(made)
    for token in extra:
        with contextlib.suppress(*ALLOWED):
            sampler.accept(token)
    sampler.sample(ctx, i)
    sampler.sample(ctx, i)


def reentrant_decode(b: int) -> None:
    """A decode whose abort callback calls back into the context."""
    ctx.set_abort_callback(lambda: bool(ctx.n_ctx()))
    try:
        ctx.decode(batches[b])
    finally:
        ctx.set_abort_callback(None)


def rpc_load(endpoint: str | None, answers: list[bytes], hello: bytes | None) -> None:
    """A model loaded on an RPC server: an endpoint of any text, or a hostile server that greets
    as llama.cpp's (or with any bytes) and then answers with any bytes."""
    if endpoint is None:
        endpoint = fake_rpc.start(answers, hello=fake_rpc.HELLO if hello is None else hello)
    llamactx.LlamaModel.load_from_file(model.path, rpc_servers=[endpoint], rpc_timeout=0.2).close()


def rpc_answer(size: int, value: int) -> bytes:
    """An answer of the awaited framing whose value is anything: a device count, an alignment,
    a size, an address."""
    value %= 1 << (8 * size)
    return size.to_bytes(8, "little") + value.to_bytes(size, "little")


rpc_values = st.one_of(
    st.sampled_from([0, 1, 3, 32, 48, 2**16 + 1, 2**31, 2**32 - 1, 2**56, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1)
)
rpc_answers = st.lists(
    st.one_of(st.binary(max_size=40), st.builds(rpc_answer, st.sampled_from([1, 4, 8]), rpc_values)),
    max_size=4,
)


def many_waiters(prompt: str, max_tokens: int, ways: list[str]) -> None:
    """One request waited for in several ways at once: threads iterating it, event loops in other
    threads awaiting it, and ``result()``; every waiter must end, and with the whole text."""
    request = engine.submit(prompt or "x", max_tokens=max_tokens % 12)
    texts: list[str] = []

    async def awaited() -> str:
        return (await request).text

    def wait(way: str) -> None:
        if way == "iterate":
            "".join(request)
        elif way == "await":
            texts.append(asyncio.run(asyncio.wait_for(awaited(), 120)))
        else:
            texts.append(request.result(timeout=120).text)

    waiters = [threading.Thread(target=wait, args=(way,)) for way in ways]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join(150)
        assert not waiter.is_alive(), "a waiter of a finished request still waits"
    assert all(text == request.result(timeout=120).text for text in texts)


def shift_bf16(delta: int) -> None:
    batch = llamactx.LlamaBatch(4)
    batch.add_sequence([1, 2, 3], 0, False)
    bf16_ctx.clear_kv_cache()
    bf16_ctx.decode(batch)
    bf16_ctx.kv_cache_seq_add(0, None, None, delta)
    batch.clear()
    batch.add(4, bf16_ctx.kv_cache_seq_pos_max(0) + 1, [0], True)
    bf16_ctx.decode(batch)


OPS: dict[str, tuple[Callable[..., Any], st.SearchStrategy[tuple[Any, ...]]]] = {
    "batch.add": (
        lambda b, t, p, s, logits: batches[b].add(t, p, s, logits),
        st.tuples(st.integers(0, 1), tokens, ints, st.lists(seqs, max_size=3), st.booleans()),
    ),
    "batch.add_sequence": (
        lambda b, ts, s, logits: batches[b].add_sequence(ts, s, logits),
        st.tuples(st.integers(0, 1), token_lists, seqs, st.booleans()),
    ),
    "batch.clear": (lambda b: batches[b].clear(), st.tuples(st.integers(0, 1))),
    "decode": (lambda b: ctx.decode(batches[b]), st.tuples(st.integers(0, 1))),
    "encode": (lambda b: ctx.encode(batches[b]), st.tuples(st.integers(0, 1))),
    "get_logits": (lambda: ctx.get_logits(), st.tuples()),
    "get_logits_ith": (lambda i: ctx.get_logits_ith(i), st.tuples(ints)),
    "candidates_ith": (lambda i: ctx.candidates_ith(i), st.tuples(ints)),
    "embeddings_ith": (lambda i: ctx.embeddings_ith(i), st.tuples(ints)),
    "embeddings_seq_ith": (lambda i: ctx.embeddings_seq_ith(i), st.tuples(seqs)),
    "get_embeddings": (lambda: ctx.get_embeddings(), st.tuples()),
    "get_sampled_token_ith": (lambda i: ctx.get_sampled_token_ith(i), st.tuples(ints)),
    "get_sampled_logits_ith": (lambda i: ctx.get_sampled_logits_ith(i), st.tuples(ints)),
    "clear_kv_cache_seq": (
        lambda s, a, b: ctx.clear_kv_cache_seq(s, a, b),
        st.tuples(st.none() | seqs, positions, positions),
    ),
    "copy_kv_cache_seq": (
        lambda s, d, a, b: ctx.copy_kv_cache_seq(s, d, a, b),
        st.tuples(seqs, seqs, positions, positions),
    ),
    "copy_cache": (lambda s, d, n: ctx.copy_cache(s, d, n), st.tuples(seqs, seqs, ints)),
    "seq_keep": (lambda s: ctx.llama_kv_cache_seq_keep(s), st.tuples(seqs)),
    "seq_add": (lambda s, a, b, d: ctx.kv_cache_seq_add(s, a, b, d), st.tuples(seqs, positions, positions, small_ints)),
    "seq_div": (lambda s, a, b, d: ctx.kv_cache_seq_div(s, a, b, d), st.tuples(seqs, positions, positions, ints)),
    "pos_max": (lambda s: ctx.kv_cache_seq_pos_max(s), st.tuples(seqs)),
    "pos_min": (lambda s: ctx.memory_seq_pos_min(s), st.tuples(seqs)),
    "state_roundtrip": (lambda m: ctx.state_set_data(state_blob(m)), st.tuples(st.integers(0, 10**7))),
    "state_set_junk": (lambda data: ctx.state_set_data(data), st.tuples(blobs)),
    "seq_state_set_junk": (lambda data, s: ctx.state_seq_set_data(data, s), st.tuples(blobs, seqs)),
    "seq_state_move": (
        lambda s, d, f: ctx.state_seq_set_data_ext(ctx.state_seq_get_data_ext(s, f), d, f),
        st.tuples(seqs, seqs, st.integers(-1, 3)),
    ),
    "sample": (lambda i: llamactx.LlamaSampler.greedy().sample(ctx, i), st.tuples(ints)),
    "grammar_accept": (
        lambda t: llamactx.LlamaSampler.grammar(model, 'root ::= "a"').accept(t),
        st.tuples(tokens),
    ),
    "set_sampler": (lambda s: ctx.set_sampler(s, llamactx.LlamaSampler.greedy()), st.tuples(seqs)),
    # Chains of any stages in any order on the backend: the next decodes build them into graphs.
    "set_sampler_chain": (
        lambda s, made: ctx.set_sampler(s, chain_of(made)),
        st.tuples(seqs, st.lists(stages, max_size=6)),
    ),
    "token_to_str": (lambda t: model.token_to_str(t), st.tuples(tokens)),
    "detokenize": (lambda ts: model.detokenize(ts), st.tuples(token_lists)),
    "str_to_token": (lambda text, bos: model.str_to_token(text, bos), st.tuples(st.text(max_size=20), st.booleans())),
    "set_causal_attn": (lambda b: ctx.set_causal_attn(b), st.tuples(st.booleans())),
    "set_embeddings": (lambda b: ctx.set_embeddings(b), st.tuples(st.booleans())),
    "set_n_threads": (lambda a, b: ctx.set_n_threads(a, b), st.tuples(st.integers(-1, 3), st.integers(-1, 3))),
    "set_warmup": (lambda b: ctx.set_warmup(b), st.tuples(st.booleans())),
    "cvec": (
        lambda n, e, a, b: ctx.set_adapter_cvec([0.01] * n, e, a, b),
        st.tuples(st.integers(0, 600), st.sampled_from([model.n_embd(), 1, -1]), small_ints, small_ints),
    ),
    "abort_callback": (lambda flag: ctx.set_abort_callback(lambda: flag), st.tuples(st.booleans())),
    "sample_chain": (
        sample_then_accept,
        st.tuples(st.lists(stages, max_size=5), ints, st.lists(tokens, max_size=4)),
    ),
    "reentrant_decode": (reentrant_decode, st.tuples(st.integers(0, 1))),
    "crafted_vocabulary": (
        crafted_vocabulary,
        st.tuples(
            st.sampled_from(["llama", "gpt2", "bert", "t5", "none"]),
            st.lists(st.one_of(st.text(max_size=6), st.sampled_from(synthetic.spm_vocabulary())), max_size=40),
            st.text(max_size=12),
        ),
    ),
    "crafted_model": (
        crafted_model,
        st.tuples(
            st.sampled_from(list(CRAFTED_MODELS)),
            st.integers(0, 3),
            st.fixed_dictionaries(
                {},
                optional={"n_seq_max": st.integers(1, 3), "kv_unified": st.booleans(), "embeddings": st.booleans()},
            ),
            st.lists(st.integers(-1, 50), max_size=6),
            st.tuples(st.integers(0, 2**16), st.integers(1, 255)),
        ),
    ),
    "crafted_projector": (
        crafted_projector,
        st.tuples(
            st.booleans(),
            st.dictionaries(
                st.sampled_from(list(PROJECTOR_KEYS)), st.tuples(PROJECTOR_VALUES, st.booleans()), max_size=3
            ),
            st.lists(st.integers(0, 200), max_size=2),
            st.integers(0, 200),
        ),
    ),
    "state_flip": (
        lambda at, bits: ctx.state_set_data(flipped_state(at, bits)),
        st.tuples(st.integers(0, 2**20), st.integers(0, 255)),
    ),
    "shift_bf16": (shift_bf16, st.tuples(ints)),
    "rpc_load": (
        rpc_load,
        st.tuples(
            # Text without a colon is refused before any connection; these ports reach no service.
            st.none()
            | st.text(st.characters(blacklist_characters=":"), max_size=12)
            | st.sampled_from(["127.0.0.1:0", "127.0.0.1:1", "127.0.0.1:65536", "127.0.0.1:-1", ":1", "[::1]:1"]),
            rpc_answers,
            st.none() | st.binary(max_size=40),
        ),
    ),
    "many_waiters": (
        many_waiters,
        st.tuples(
            st.text(max_size=10),
            small_ints,
            st.lists(st.sampled_from(["iterate", "await", "result"]), min_size=1, max_size=4),
        ),
    ),
    "engine_request": (
        engine_request,
        st.tuples(
            st.integers(0, len(engines) - 1),
            st.one_of(token_lists, st.text(max_size=20)),
            ints,
            st.lists(st.text(max_size=3), max_size=3),
            st.none() | sampling_params,
            ints,
            st.none() | st.sampled_from([*GRAMMARS, "root ::= ("]),
        ),
    ),
    "engine_stats": (lambda: engine.stats(), st.tuples()),
    "image_into_context": (
        image_into_context,
        st.tuples(image_data, st.one_of(st.just(2**25), ints), st.text(max_size=6), positions, seqs),
    ),
    "image_chat": (
        image_chat,
        st.tuples(
            image_data,
            st.text(max_size=6),
            st.sampled_from(["data:image/png;base64,", "data:image/gif;base64,", "http://", "data:image/png,"]),
            st.integers(0, 4),
            st.tuples(
                st.one_of(st.integers(-1, 4), st.just(16)),
                st.one_of(st.sampled_from([1, 64 * 64, 2**25, 2**27, 2**27 + 1]), ints),
                st.one_of(st.sampled_from([0.05, 1.0, 600.0]), st.floats(allow_nan=True)),
            ),
        ),
    ),
    "speculative_generation": (
        speculative_generation,
        st.tuples(
            st.sampled_from(["ngram", "draft_model"]),
            ints,
            SAMPLING_FLOATS,
            st.one_of(token_lists, st.text(max_size=20)),
            small_ints,
            st.lists(st.text(max_size=3), max_size=2),
            seqs,
        ),
    ),
    "continue_sequence": (
        continued_sequence,
        st.tuples(token_lists, small_ints, seqs, st.booleans(), st.lists(st.text(max_size=3), max_size=2)),
    ),
    "generate_batch": (
        lambda prompts, max_tokens: llamactx.generate_batch(ctx, prompts, max_tokens=max_tokens),
        st.tuples(st.lists(st.one_of(token_lists, st.text(max_size=12)), max_size=5), small_ints),
    ),
    "constrained_generation": (
        constrained_generation,
        st.tuples(CONSTRAINT_KINDS, constraint_texts, st.text(max_size=10), small_ints),
    ),
    "structured_request": (
        structured_request,
        st.tuples(st.one_of(schemas, st.text(max_size=10)), tools, tool_choices, chat_messages, ints),
    ),
    "template_chat": (
        template_chat,
        st.tuples(
            templates,
            chat_messages,
            tools,
            st.sampled_from(["auto", "none", "required", "x"]),
            st.booleans(),
            template_variables,
            st.sampled_from([*llamactx.REASONING_FORMATS, "x"]),
            st.integers(-2, 2**31 - 1),
        ),
    ),
    "prepared_chat": (
        prepared_chat,
        st.tuples(tools, tool_choices, chat_messages, small_ints, st.none() | st.sampled_from([{"type": "integer"}])),
    ),
    "embed_inputs": (
        lambda inputs: llamactx.embed(embedder, inputs),
        st.tuples(st.lists(st.one_of(token_lists, st.text(max_size=20)), max_size=3)),
    ),
    "engine_restore_slot": (
        lambda file, seq: engine.restore_slot(file, seq),
        st.tuples(slot_files, st.one_of(st.none(), seqs)),
    ),
    "engine_save_slots": (lambda seq: engine.save_slots(seq), st.tuples(st.one_of(st.none(), seqs))),
    "engine_erase_slot": (lambda seq: engine.erase_slot(seq), st.tuples(seqs)),
    "engine_slots": (lambda: engine.slots(), st.tuples()),
    # The engine has no adapter: every scale is refused, a NaN or infinite one included.
    "engine_lora_scale": (
        lambda scale: engine.submit("Hi", max_tokens=1, lora_scale=scale).result(),
        st.tuples(st.floats(allow_nan=True, allow_infinity=True)),
    ),
    "rerank": (
        lambda query, documents: llamactx.rerank(ranker, query, documents),
        st.tuples(rerank_texts, st.lists(rerank_texts, max_size=3)),
    ),
    "rerank_prompt": (
        lambda query, document: llamactx._llamactx._rerank_prompt(model, query, document),
        st.tuples(rerank_texts, rerank_texts),
    ),
    "engine_tokens": (lambda prompt: engine.tokens(prompt), st.tuples(st.one_of(token_lists, st.text(max_size=20)))),
    "engine_chat_tokens": (
        lambda messages: engine.chat_tokens(messages),
        st.tuples(st.lists(st.tuples(st.text(max_size=10), st.text(max_size=20)), max_size=3)),
    ),
}

calls = st.lists(st.sampled_from(sorted(OPS)).flatmap(lambda name: st.tuples(st.just(name), OPS[name][1])), max_size=8)


@settings(
    max_examples=int(sys.argv[2]),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(calls)
def test_program(program: list[tuple[str, tuple[Any, ...]]]) -> None:
    reset()
    for name, args in program:
        print("CALL", name, args, flush=True)
        with contextlib.suppress(*ALLOWED):
            OPS[name][0](*args)


if __name__ == "__main__":
    test_program()
    print("FUZZ DONE", flush=True)
