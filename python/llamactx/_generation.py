"""Text generation: ``stream``/``generate`` on one sequence of a context, ``generate_batch`` on
many sequences of one context at once."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

from llamactx._constraints import JsonSchema, constrained
from llamactx._llamactx import (
    LlamaBatch,
    LlamaContext,
    LlamaSampler,
    MtmdContext,
    _check_prompt,
    _ContextLoop,
    _RequestCore,
)
from llamactx._media import MediaPrompt
from llamactx._schema_check import OutputCheck
from llamactx._speculative import Speculative

__all__ = ["continue_from", "continue_sequence", "generate", "generate_batch", "prefill", "stream", "stream_media"]


def _prompt_tokens(ctx: LlamaContext, prompt: str | Sequence[int], max_tokens: int) -> list[int]:
    """The prompt's tokens, checked to leave room in one sequence of ``ctx``."""
    if isinstance(prompt, str):
        model = ctx.model
        tokens = model.str_to_token(prompt, model.add_bos_token())
    else:
        tokens = [int(token) for token in prompt]
    _check_prompt(len(tokens), ctx.n_ctx_seq(), max_tokens=max_tokens)
    return tokens


def _stops(stop: str | Sequence[str]) -> list[str]:
    # One string is one stop string, not a sequence of one-character ones.
    return [stop] if isinstance(stop, str) else list(stop)


def _run(loop: _ContextLoop, request: _RequestCore) -> Generator[str, None, str]:
    """Steps ``loop`` until ``request`` ends, yielding its text as it comes; returns its finish
    reason. A caller that stops reading (or an exception, such as Ctrl-C, between steps) cancels
    it, and the step that ends it runs at once, so that its sequence's tokens are reported."""
    try:
        while True:
            left = loop.step()
            kind, piece = request.poll()
            while piece is not None:
                yield piece[0]
                kind, piece = request.poll()
            if kind == "end":
                completion = request.result_now()
                assert completion is not None  # the request ended
                return completion.finish_reason
            if not left:
                raise RuntimeError("the generation loop ended before its request")
    except BaseException:
        if not request.done:
            request.cancel()
            loop.step()
        raise


def prefill(
    ctx: LlamaContext,
    tokens: Sequence[int],
    seq_id: int,
    start: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Decodes ``tokens[start:]`` into ``seq_id`` at their positions, in chunks of ``n_batch``,
    with logits for the last token only. ``progress(done, total)`` is called after each chunk."""
    n_batch = ctx.n_batch()
    batch = LlamaBatch(max(n_batch, 1))
    for chunk_start in range(start, len(tokens), n_batch):
        batch.clear()
        chunk_end = min(chunk_start + n_batch, len(tokens))
        for pos in range(chunk_start, chunk_end):
            batch.add(tokens[pos], pos, [seq_id], pos == len(tokens) - 1)
        ctx.decode(batch)
        if progress is not None:
            progress(chunk_end, len(tokens))


def continue_sequence(
    ctx: LlamaContext,
    history: list[int],
    *,
    max_tokens: int,
    sampler: LlamaSampler,
    stop: Sequence[str] = (),
    seq_id: int = 0,
    speculative: Speculative | None = None,
) -> Generator[str, None, str]:
    """Generates after ``history``, whose tokens ``seq_id`` already holds, the last with logits.
    Each token decoded is appended to ``history``, which so keeps mirroring the KV cache. The
    generator's return value is the finish reason: "stop" or "length".

    The sequence runs on the engine's step loop (on ``ctx``, between whose steps the caller's
    code runs); ``sampler`` chooses the tokens and keeps its state after the last. With
    ``speculative``, each sampled token is decoded together with the tokens drafted to follow
    it, and the outputs are sampled in turn while the token sampled is the next drafted one:
    the same tokens in fewer decodes (but at near-ties: see ``NgramDraft``)."""
    loop = _ContextLoop(ctx, [seq_id], speculative)
    if max_tokens <= 0:
        return "length"
    request = loop.submit(history, max_tokens, _stops(stop), sampler, held_seq=seq_id)
    try:
        return (yield from _run(loop, request))
    finally:
        history += loop.held()[len(history) :]


def continue_from(
    ctx: LlamaContext,
    mtmd: MtmdContext | None,
    prompt: MediaPrompt,
    holds: list[int],
    *,
    max_tokens: int,
    sampler: LlamaSampler,
    stop: Sequence[str] = (),
    seq_id: int = 0,
    speculative: Speculative | None = None,
) -> Generator[str, None, str]:
    """Generates after ``prompt`` in sequence ``seq_id`` of ``ctx``, which holds ``holds`` from
    position 0 (what an earlier call left there, or nothing): the prompt reads only what follows
    the start they share, and the rest of the sequence is cleared. ``mtmd`` (the projector that
    tokenized the prompt's media; None for a prompt without any) encodes its media. Afterwards,
    even after a failure, ``holds`` is what the sequence holds: the prompt read (each medium's
    positions as negative placeholders) and the tokens generated. ``sampler`` and
    ``speculative`` as in ``continue_sequence``, whose step loop this is."""
    loop = _ContextLoop(ctx, [seq_id], speculative, mtmd=mtmd)
    request = loop.submit(
        prompt.tokens, max_tokens, _stops(stop), sampler, held_seq=seq_id, holds=holds, media=prompt.spans()
    )
    try:
        return (yield from _run(loop, request))
    finally:
        holds[:] = loop.held()


def stream(
    ctx: LlamaContext,
    prompt: str | Sequence[int],
    *,
    max_tokens: int = 128,
    sampler: LlamaSampler | None = None,
    stop: Sequence[str] = (),
    seq_id: int = 0,
    progress: Callable[[int, int], None] | None = None,
    json_schema: JsonSchema | None = None,
    grammar: str | None = None,
    speculative: Speculative | None = None,
) -> Generator[str, None, str]:
    """Generates up to ``max_tokens`` tokens after ``prompt`` and yields their text as it comes.

    The sequence ``seq_id`` of ``ctx`` is cleared first. ``sampler`` defaults to greedy.
    Generation ends at an end-of-generation token, at a ``stop`` string (not included), at
    ``max_tokens`` or when the sequence reaches the context size. Text is decoded
    incrementally as UTF-8: a character split across tokens is emitted once complete.
    ``progress(done, total)`` reports the prompt's decoding, one call per ``n_batch`` chunk.
    The generator's return value is the finish reason: "stop" or "length".

    ``json_schema`` (a dict, JSON text, or a pydantic model / dataclass / TypedDict class) or
    ``grammar`` (GBNF; llguidance's Lark when it starts with ``%llguidance``) constrains the
    output, masking the candidates before ``sampler`` sees them; it may only end where the
    constraint is complete. ``SchemaError`` for a schema llguidance cannot compile,
    ``SamplerInitError`` for GBNF llama.cpp cannot parse, before anything is decoded; and, after
    the last piece, for a value that breaks a keyword of the schema llguidance cannot enforce
    while generating (``uniqueItems``, ``not``, ...: every finished value is validated).

    ``speculative`` (an ``NgramDraft`` or a ``DraftModel``) drafts tokens, by n-gram lookup in
    the prompt and output or with a draft model, and verifies them in one decode: the same
    output in fewer decodes, as in ``Engine``. ``ValueError`` for a recurrent or hybrid model,
    or a draft model whose vocabulary is not the model's.
    """
    tokens = _prompt_tokens(ctx, prompt, max_tokens)

    def start(chooser: LlamaSampler) -> Generator[str, None, str]:
        ctx.clear_kv_cache_seq(seq_id)
        prefill(ctx, tokens, seq_id, progress=progress)
        return continue_sequence(
            ctx, tokens, max_tokens=max_tokens, sampler=chooser, stop=stop, seq_id=seq_id, speculative=speculative
        )

    return (yield from _constrained(ctx, sampler, json_schema, grammar, start))


def stream_media(
    ctx: LlamaContext,
    mtmd: MtmdContext,
    prompt: MediaPrompt,
    *,
    max_tokens: int,
    sampler: LlamaSampler | None,
    stop: Sequence[str],
    seq_id: int,
    json_schema: JsonSchema | None,
    grammar: str | None,
) -> Generator[str, None, str]:
    """``stream`` for a prompt with images, which ``mtmd`` encodes (a prompt too long for the
    context is refused before any is)."""
    _check_prompt(prompt.n_tokens, ctx.n_ctx_seq(), max_tokens=max_tokens, images=True)

    def start(chooser: LlamaSampler) -> Generator[str, None, str]:
        return continue_from(ctx, mtmd, prompt, [], max_tokens=max_tokens, sampler=chooser, stop=stop, seq_id=seq_id)

    return (yield from _constrained(ctx, sampler, json_schema, grammar, start))


def _constrained(
    ctx: LlamaContext,
    sampler: LlamaSampler | None,
    json_schema: JsonSchema | None,
    grammar: str | None,
    start: Callable[[LlamaSampler], Generator[str, None, str]],
) -> Generator[str, None, str]:
    """The generation ``start`` begins with ``sampler`` (greedy when None) held to
    ``json_schema`` or ``grammar``, which are compiled before it begins; a finished value is
    checked against the schema, as ``stream`` describes."""
    chooser, check = constrained(ctx.model, sampler, json_schema, grammar)
    generation = start(chooser or LlamaSampler.greedy())
    return (yield from generation if check is None else _checked(generation, check))


def _checked(generation: Generator[str, None, str], check: OutputCheck) -> Generator[str, None, str]:
    """``generation``'s pieces, then ``check`` of their whole text if it ended complete."""
    pieces: list[str] = []
    while True:
        try:
            piece = next(generation)
        except StopIteration as end:
            if end.value == "stop":
                check.validate("".join(pieces))
            return str(end.value)
        pieces.append(piece)
        yield piece


def generate(
    ctx: LlamaContext,
    prompt: str | Sequence[int],
    *,
    max_tokens: int = 128,
    sampler: LlamaSampler | None = None,
    stop: Sequence[str] = (),
    seq_id: int = 0,
    json_schema: JsonSchema | None = None,
    grammar: str | None = None,
    speculative: Speculative | None = None,
) -> str:
    """The whole text ``stream`` yields for the same arguments (greedy when ``sampler`` is None)."""
    pieces = stream(
        ctx,
        prompt,
        max_tokens=max_tokens,
        sampler=sampler,
        stop=stop,
        seq_id=seq_id,
        json_schema=json_schema,
        grammar=grammar,
        speculative=speculative,
    )
    return "".join(pieces)


def _share_prefix(ctx: LlamaContext, loop: _ContextLoop, token_lists: Sequence[list[int]]) -> None:
    """Decodes the prompt start common to ``token_lists`` (all but the last token of the shortest
    at most) once, copies it to the first ``len(token_lists)`` sequences, and tells ``loop`` they
    hold it: each prompt reads only what follows it."""
    shortest = min((len(tokens) for tokens in token_lists), default=0)
    prefix = 0
    while prefix < shortest - 1 and all(tokens[prefix] == token_lists[0][prefix] for tokens in token_lists):
        prefix += 1
    if len(token_lists) < 2 or prefix == 0:
        return
    shared = token_lists[0][:prefix]
    prefill(ctx, shared, 0)
    for seq in range(len(token_lists)):
        if seq > 0:
            ctx.copy_kv_cache_seq(0, seq)
        loop.adopt(shared, seq)


def generate_batch(
    ctx: LlamaContext,
    prompts: Sequence[str | Sequence[int]],
    *,
    max_tokens: int = 128,
    sampler: LlamaSampler | None = None,
    stop: Sequence[str] = (),
    json_schema: JsonSchema | None = None,
    grammar: str | None = None,
) -> list[str]:
    """Generates after every prompt at once, each in its own sequence of ``ctx``, on the
    engine's step loop: prompts read in chunks of ``n_batch`` tokens, then one decode per step
    for all sequences still running. A prompt start common to the first ``n_seq_max`` prompts is
    decoded once and copied to their sequences.

    Up to ``ctx.n_seq_max()`` prompts run together; the others wait for a finished sequence,
    whose cells they reuse as far as their prompts agree (the engine's prefix cache). Each
    sequence samples with its own copy of ``sampler`` (greedy when None). The whole KV cache of
    ``ctx`` is cleared. With greedy sampling the results equal ``generate`` called on each
    prompt. ``json_schema`` and ``grammar`` constrain every output, as in ``stream``;
    ``SchemaError`` when a finished value breaks a keyword of the schema that llguidance cannot
    enforce.
    """
    token_lists = [_prompt_tokens(ctx, prompt, max_tokens) for prompt in prompts]
    sampler, check = constrained(ctx.model, sampler, json_schema, grammar)
    n_seq = ctx.n_seq_max()
    loop = _ContextLoop(ctx, list(range(n_seq)), prefix_cache=True)
    ctx.clear_kv_cache()
    _share_prefix(ctx, loop, token_lists[:n_seq])
    stops = _stops(stop)
    chooser = sampler or LlamaSampler.greedy()
    requests = [loop.submit(tokens, max_tokens, stops, chooser) for tokens in token_lists]
    while loop.step():
        pass
    results: list[str] = []
    for request in requests:
        completion = request.result_now()
        assert completion is not None  # the loop ran every request to its end
        if check is not None and completion.finish_reason == "stop":
            check.validate(completion.text)
        results.append(completion.text)
    return results
