"""Text generation on one sequence of a context: ``stream`` yields text as it is decoded."""

from __future__ import annotations

import codecs
from collections.abc import Iterator, Sequence

from llamactx._llamactx import LlamaBatch, LlamaContext, LlamaSampler

__all__ = ["generate", "stream"]


def _prompt_tokens(ctx: LlamaContext, prompt: str | Sequence[int]) -> list[int]:
    if isinstance(prompt, str):
        model = ctx.model
        return model.str_to_token(prompt, model.add_bos_token())
    return [int(token) for token in prompt]


class _StopFilter:
    """Holds back text that may be the start of a stop string, and finds complete ones."""

    def __init__(self, stop: Sequence[str]) -> None:
        self._stop = [s for s in stop if s]
        self._pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Returns the text safe to emit and whether a stop string was reached."""
        self._pending += text
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            out, self._pending = self._pending[: min(hits)], ""
            return out, True
        keep = max((_overlap(self._pending, s) for s in self._stop), default=0)
        cut = len(self._pending) - keep
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0


def stream(
    ctx: LlamaContext,
    prompt: str | Sequence[int],
    *,
    max_tokens: int = 128,
    sampler: LlamaSampler | None = None,
    stop: Sequence[str] = (),
    seq_id: int = 0,
) -> Iterator[str]:
    """Generates up to ``max_tokens`` tokens after ``prompt`` and yields their text as it comes.

    The sequence ``seq_id`` of ``ctx`` is cleared first. ``sampler`` defaults to greedy.
    Generation ends at an end-of-generation token, at a ``stop`` string (not included), at
    ``max_tokens`` or when the sequence reaches the context size. Text is decoded
    incrementally as UTF-8: a character split across tokens is emitted once complete.
    """
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    model = ctx.model
    tokens = _prompt_tokens(ctx, prompt)
    if not tokens:
        raise ValueError("the prompt has no tokens")
    n_ctx = ctx.n_ctx_seq()
    if len(tokens) >= n_ctx:
        raise ValueError(f"the prompt has {len(tokens)} tokens; the context holds {n_ctx} per sequence")
    sampler = sampler if sampler is not None else LlamaSampler.greedy()
    ctx.clear_kv_cache_seq(seq_id)

    n_batch = ctx.n_batch()
    batch = LlamaBatch(max(n_batch, 1))
    for start in range(0, len(tokens), n_batch):
        chunk = tokens[start : start + n_batch]
        batch.clear()
        for offset, token in enumerate(chunk):
            pos = start + offset
            batch.add(token, pos, [seq_id], pos == len(tokens) - 1)
        ctx.decode(batch)

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stops = _StopFilter(stop)
    pos = len(tokens)
    for _ in range(max_tokens):
        token = sampler.sample(ctx, -1)  # also accepts the token into the sampler's state
        if model.is_eog_token(token):
            break
        text, stopped = stops.push(decoder.decode(model.token_to_bytes(token, False)))
        if text:
            yield text
        if stopped:
            return
        if pos >= n_ctx:
            break
        batch.clear()
        batch.add(token, pos, [seq_id], True)
        ctx.decode(batch)
        pos += 1
    tail, stopped = stops.push(decoder.decode(b"", final=True))
    if not stopped:
        tail += stops.flush()
    if tail:
        yield tail


def generate(
    ctx: LlamaContext,
    prompt: str | Sequence[int],
    *,
    max_tokens: int = 128,
    sampler: LlamaSampler | None = None,
    stop: Sequence[str] = (),
    seq_id: int = 0,
) -> str:
    """The whole text ``stream`` yields for the same arguments (greedy when ``sampler`` is None)."""
    return "".join(stream(ctx, prompt, max_tokens=max_tokens, sampler=sampler, stop=stop, seq_id=seq_id))
