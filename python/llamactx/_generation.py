"""Text generation: ``stream``/``generate`` on one sequence of a context, ``generate_batch`` on
many sequences of one context at once."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

from llamactx._constraints import JsonSchema, constrained
from llamactx._llamactx import (
    LlamaBatch,
    LlamaContext,
    LlamaModel,
    LlamaSampler,
    MtmdContext,
    _check_prompt,
    _Drafter,
    _SequenceSteps,
)
from llamactx._media import MEDIA_POSITION, MediaPrompt
from llamactx._schema_check import OutputCheck
from llamactx._speculative import Speculative

__all__ = ["continue_sequence", "generate", "generate_batch", "prefill", "prefill_media", "stream", "stream_media"]


def _prompt_tokens(ctx: LlamaContext, prompt: str | Sequence[int], max_tokens: int) -> list[int]:
    """The prompt's tokens, checked to leave room in one sequence of ``ctx``."""
    if isinstance(prompt, str):
        model = ctx.model
        tokens = model.str_to_token(prompt, model.add_bos_token())
    else:
        tokens = [int(token) for token in prompt]
    _check_prompt(len(tokens), ctx.n_ctx_seq(), max_tokens=max_tokens)
    return tokens


def _steps(model: LlamaModel, stop: str | Sequence[str], max_tokens: int, n_ctx: int) -> _SequenceSteps:
    """The generation rules the engine follows too (text, stop strings, limits), for one sequence."""
    # One string is one stop string, not a sequence of one-character ones.
    stops = [stop] if isinstance(stop, str) else list(stop)
    return _SequenceSteps(model, stops, max_tokens, n_ctx)


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


def prefill_media(
    ctx: LlamaContext, mtmd: MtmdContext | None, prompt: MediaPrompt, seq_id: int, *, keep: int = 0
) -> tuple[list[int], list[int]]:
    """Decodes ``prompt`` into ``seq_id``, whose cache already holds its first ``keep`` items
    (``MediaPrompt.keys``; an image is one item) and nothing after them; the last token gets
    logits. ``mtmd`` (the projector that tokenized the prompt's media) encodes the images (None
    for a prompt without any). Returns the sequence's history (its tokens, ``MEDIA_POSITION`` at
    each position an image takes: ``continue_sequence`` counts positions by it) and the
    positions of each item."""
    if prompt.chunks and mtmd is None:
        raise ValueError("a prompt with images needs the projector (mtmd) that reads them")
    history: list[int] = []
    widths: list[int] = []
    for number, run in enumerate(prompt.texts):
        if number > 0 and mtmd is not None:  # always, for a prompt with images (checked above)
            chunks = prompt.chunks[number - 1]
            if len(widths) >= keep:
                end = mtmd.eval_chunks(ctx, chunks, len(history), seq_id, logits_last=False)
            else:
                end = len(history) + chunks.n_pos()
            widths.append(end - len(history))
            history += [MEDIA_POSITION] * widths[-1]
        start = len(history) + max(0, keep - len(widths))
        history += run
        widths += [1] * len(run)
        if start < len(history):
            prefill(ctx, history, seq_id, start=start)
    return history, widths


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

    With ``speculative``, each sampled token is decoded together with the tokens drafted to
    follow it, and the outputs are sampled in turn while the token sampled is the next drafted
    one (as the engine does): the same tokens in fewer decodes (but at near-ties: see
    ``NgramDraft``)."""
    drafter = None if speculative is None else _Drafter(ctx.model, speculative, ctx.n_ctx_seq(), ctx.n_threads())
    if max_tokens <= 0:
        return "length"
    steps = _steps(ctx.model, stop, max_tokens, ctx.n_ctx_seq())
    batch = LlamaBatch(1 + (0 if drafter is None else drafter.most))
    draft: list[int] = []
    rows = [-1]  # the outputs to sample from: the last decoded token's, then each drafted one's
    sampled = 0
    while True:
        accepted = 0
        for row in rows:
            token = sampler.sample(ctx, row)  # also accepts the token into the sampler's state
            sampled += 1
            piece, finish = steps.take(token, len(history))
            if piece:
                try:
                    yield piece
                except GeneratorExit:  # the caller stopped reading: the KV cache holds history
                    _drop_drafted(ctx, seq_id, history, draft, accepted)
                    raise
            if finish is not None:
                _drop_drafted(ctx, seq_id, history, draft, accepted)
                return finish
            if accepted == len(draft) or token != draft[accepted]:
                break
            history.append(token)  # a drafted token, already decoded
            accepted += 1
        if drafter is not None and draft:
            drafter.record(len(draft), accepted)
        _drop_drafted(ctx, seq_id, history, draft, accepted)
        # Never past max_tokens, nor past the token that fills the sequence.
        limit = min(max_tokens - sampled - 1, ctx.n_ctx_seq() - len(history) - 2)
        draft = [] if drafter is None or limit <= 0 else drafter.draft(history, token, limit)
        batch.clear()
        for offset, next_token in enumerate([token, *draft]):
            batch.add(next_token, len(history) + offset, [seq_id], True)
        ctx.decode(batch)
        history.append(token)
        rows = list(range(len(draft) + 1))


def _drop_drafted(ctx: LlamaContext, seq_id: int, history: list[int], draft: list[int], accepted: int) -> None:
    """Removes the cells of the drafted tokens that were not accepted."""
    if accepted < len(draft) and not ctx.clear_kv_cache_seq(seq_id, len(history), None):
        raise ValueError("the KV cache could not remove the cells of a rejected draft")


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

    def read_prompt() -> list[int]:
        prefill(ctx, tokens, seq_id, progress=progress)
        return tokens

    return (
        yield from _stream_after(
            ctx,
            read_prompt,
            max_tokens=max_tokens,
            sampler=sampler,
            stop=stop,
            seq_id=seq_id,
            json_schema=json_schema,
            grammar=grammar,
            speculative=speculative,
        )
    )


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
    return (
        yield from _stream_after(
            ctx,
            lambda: prefill_media(ctx, mtmd, prompt, seq_id)[0],
            max_tokens=max_tokens,
            sampler=sampler,
            stop=stop,
            seq_id=seq_id,
            json_schema=json_schema,
            grammar=grammar,
            speculative=None,
        )
    )


def _stream_after(
    ctx: LlamaContext,
    read_prompt: Callable[[], list[int]],
    *,
    max_tokens: int,
    sampler: LlamaSampler | None,
    stop: Sequence[str],
    seq_id: int,
    json_schema: JsonSchema | None,
    grammar: str | None,
    speculative: Speculative | None,
) -> Generator[str, None, str]:
    """Clears ``seq_id``, reads the prompt into it (``read_prompt`` returns its history) and
    generates after it, as ``stream`` describes."""
    constrained_sampler, check = constrained(ctx.model, sampler, json_schema, grammar)
    ctx.clear_kv_cache_seq(seq_id)
    generation = continue_sequence(
        ctx,
        read_prompt(),
        max_tokens=max_tokens,
        sampler=constrained_sampler or LlamaSampler.greedy(),
        stop=stop,
        seq_id=seq_id,
        speculative=speculative,
    )
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


class _Sequence:
    """One prompt of ``generate_batch`` while it generates."""

    def __init__(self, seq_id: int, tokens: list[int], sampler: LlamaSampler, steps: _SequenceSteps) -> None:
        self.seq_id = seq_id
        self.tokens = tokens
        self.sampler = sampler
        self.steps = steps
        self.pieces: list[str] = []
        self.finish: str | None = None


def _common_prefix(token_lists: Sequence[list[int]]) -> int:
    shortest = min(len(tokens) for tokens in token_lists)
    n = 0
    while n < shortest and all(tokens[n] == token_lists[0][n] for tokens in token_lists):
        n += 1
    return n


def _decode_prompts(ctx: LlamaContext, group: list[_Sequence]) -> dict[int, int]:
    """Decodes the prompts of ``group`` (a shared prefix once, copied to the others) and samples
    each sequence's first token as soon as the decode holding its last prompt token is done.
    Returns the first sampled token of each sequence."""
    n_batch = ctx.n_batch()
    prefix = _common_prefix([s.tokens for s in group]) if len(group) > 1 else 0
    prefix = min(prefix, min(len(s.tokens) for s in group) - 1)  # each keeps a token to sample from
    pending: list[tuple[_Sequence, int, int]] = []  # (sequence, position, token) left to decode
    if prefix > 0:
        leader = group[0]
        prefill(ctx, leader.tokens[:prefix], leader.seq_id)
        for follower in group[1:]:
            ctx.copy_kv_cache_seq(leader.seq_id, follower.seq_id)
    for sequence in group:
        pending += [(sequence, pos, sequence.tokens[pos]) for pos in range(prefix, len(sequence.tokens))]
    first: dict[int, int] = {}
    for start in range(0, len(pending), n_batch):
        chunk = pending[start : start + n_batch]
        batch = LlamaBatch(len(chunk), 1)
        rows: list[tuple[_Sequence, int]] = []
        for row, (sequence, pos, token) in enumerate(chunk):
            last = pos == len(sequence.tokens) - 1
            batch.add(token, pos, [sequence.seq_id], last)
            if last:
                rows.append((sequence, row))
        ctx.decode(batch)
        for sequence, row in rows:
            first[sequence.seq_id] = sequence.sampler.sample(ctx, row)
    return first


def _take(sequence: _Sequence, token: int) -> bool:
    """Adds a sampled token to ``sequence`` as ``stream`` would; False once it is finished."""
    piece, finish = sequence.steps.take(token, len(sequence.tokens))
    sequence.pieces.append(piece)
    if finish is not None:
        sequence.finish = finish
        return False
    sequence.tokens.append(token)
    return True


def _generate_group(ctx: LlamaContext, group: list[_Sequence], max_tokens: int) -> None:
    if max_tokens == 0:
        return
    ctx.clear_kv_cache()
    next_token = _decode_prompts(ctx, group)
    live = group
    while live:
        running = [s for s in live if _take(s, next_token[s.seq_id])]
        for finished in live:
            if finished not in running:
                ctx.clear_kv_cache_seq(finished.seq_id)  # frees its cells for the others
        live = running
        if not live:
            break
        batch = LlamaBatch(len(live), 1)
        for sequence in live:
            batch.add(sequence.tokens[-1], len(sequence.tokens) - 1, [sequence.seq_id], True)
        ctx.decode(batch)
        next_token = {s.seq_id: s.sampler.sample(ctx, row) for row, s in enumerate(live)}


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
    """Generates after every prompt at once, each in its own sequence of ``ctx``: one decode per
    step for all sequences still running. A prompt prefix common to all is decoded once and
    copied to the other sequences. Finished sequences leave the batch and free their KV cells.

    Up to ``ctx.n_seq_max()`` prompts run together (more are done in groups). Each sequence
    samples with its own copy of ``sampler`` (greedy when None). The whole KV cache of ``ctx``
    is cleared. With greedy sampling the results equal ``generate`` called on each prompt.
    ``json_schema`` and ``grammar`` constrain every output, as in ``stream``; ``SchemaError``
    when a finished value breaks a keyword of the schema that llguidance cannot enforce.
    """
    model = ctx.model
    token_lists = [_prompt_tokens(ctx, prompt, max_tokens) for prompt in prompts]
    sampler, check = constrained(model, sampler, json_schema, grammar)
    results: list[str] = []
    n_seq = ctx.n_seq_max()
    for start in range(0, len(token_lists), n_seq):
        group = [
            _Sequence(
                seq_id,
                list(tokens),
                LlamaSampler.greedy() if sampler is None else LlamaSampler.chain([sampler]),
                _steps(model, stop, max_tokens, ctx.n_ctx_seq()),
            )
            for seq_id, tokens in enumerate(token_lists[start : start + n_seq])
        ]
        _generate_group(ctx, group, max_tokens)
        results += ["".join(s.pieces) for s in group]
        if check is not None:
            for sequence, text in zip(group, results[start:], strict=True):
                if sequence.finish == "stop":
                    check.validate(text)
    return results
