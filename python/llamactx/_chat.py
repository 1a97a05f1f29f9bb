"""Chat with the model's own chat template."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from llamactx._constraints import JsonSchema
from llamactx._generation import continue_sequence, generate, prefill
from llamactx._llamactx import LlamaContext, LlamaSampler
from llamactx._render import ChatRenderer, Message
from llamactx._speculative import Speculative

__all__ = ["ChatSession", "chat"]


def chat(
    ctx: LlamaContext,
    messages: Sequence[Message],
    *,
    max_tokens: int = 256,
    sampler: LlamaSampler | None = None,
    stop: Sequence[str] = (),
    seq_id: int = 0,
    json_schema: JsonSchema | None = None,
    grammar: str | None = None,
    speculative: Speculative | None = None,
) -> str:
    """The assistant's reply to ``messages`` (``{"role", "content"}`` dicts or pairs), formatted
    with the model's chat template; greedy when ``sampler`` is None. ``json_schema``,
    ``grammar`` and ``speculative`` as in ``stream``."""
    prompt = ChatRenderer(ctx.model).prepare(messages).tokens
    return generate(
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


class ChatSession:
    """A conversation whose history stays in the KV cache of sequence 0 between turns: each
    turn decodes only the tokens that follow what the cache already holds."""

    def __init__(self, ctx: LlamaContext, *, system: str | None = None, max_tokens: int = 256) -> None:
        self.ctx = ctx
        self.max_tokens = max_tokens
        self.messages: list[tuple[str, str]] = [("system", system)] if system else []
        self._renderer = ChatRenderer(ctx.model)
        self._cached: list[int] = []

    def send(
        self, text: str, sampler: LlamaSampler | None = None, *, speculative: Speculative | None = None
    ) -> Iterator[str]:
        """Adds the user's ``text`` and yields the reply as it is generated (greedy when
        ``sampler`` is None; ``speculative`` as in ``stream``)."""
        messages = [*self.messages, ("user", text)]
        tokens = self._renderer.prepare(messages).tokens
        if len(tokens) >= self.ctx.n_ctx_seq():
            raise ValueError("the conversation no longer fits the context")
        reply: list[str] = []
        try:
            keep = 0
            while keep < min(len(tokens), len(self._cached)) - 1 and tokens[keep] == self._cached[keep]:
                keep += 1
            self.ctx.clear_kv_cache_seq(0, keep, None)
            self._cached = []
            prefill(self.ctx, tokens, 0, start=keep)
            self._cached = tokens
            for piece in continue_sequence(
                self.ctx,
                tokens,
                max_tokens=self.max_tokens,
                sampler=sampler or LlamaSampler.greedy(),
                speculative=speculative,
            ):
                reply.append(piece)
                yield piece
        except GeneratorExit:
            # The caller stopped reading: what it read is the assistant's turn.
            self.messages = [*messages, ("assistant", "".join(reply))]
            raise
        except BaseException:
            # A failed turn leaves the conversation as it was; the next one decodes it afresh.
            self._cached = []
            raise
        self.messages = [*messages, ("assistant", "".join(reply))]
