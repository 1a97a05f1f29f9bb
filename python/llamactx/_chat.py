"""Chat with the model's own chat template."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from llamactx._constraints import JsonSchema
from llamactx._generation import continue_from, generate, stream_media
from llamactx._llamactx import LlamaContext, LlamaSampler, MtmdContext, _check_prompt
from llamactx._media import MediaBudget, MediaPrompt
from llamactx._reasoning import Reasoning
from llamactx._render import ChatRenderer, Message, PreparedChat
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
    mtmd: MtmdContext | None = None,
    media_budget: MediaBudget = MediaBudget(),
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    reasoning: Reasoning = Reasoning(),
) -> str:
    """The assistant's reply to ``messages`` (``{"role", "content"}`` dicts or pairs), formatted
    with the model's chat template; greedy when ``sampler`` is None. ``json_schema``,
    ``grammar`` and ``speculative`` as in ``stream``.

    A message's ``content`` may be OpenAI's list of parts: ``{"type": "text", "text": ...}`` and,
    with ``mtmd`` (a projector loaded for the model), ``{"type": "image_url", "image_url":
    {"url": "data:image/png;base64,..."}}``; ``ValueError`` for an image without one, ``ImageError``
    for image data that does not decode, ``ChatInputError`` (a ``ValueError``) for media past
    ``media_budget``, ``ValueError`` for a prompt, media included, too long for the context.
    ``speculative`` does not take images. ``chat_template`` (Jinja source, or the name of one of
    llama.cpp's built-in formats such as ``"chatml"``) replaces the model's template, as in
    ``Engine``; a model without one is rendered as ChatML, as llama.cpp does. ``chat_template_kwargs``
    are further variables of the template, as in ``Engine.submit_chat``. ``reasoning``'s budget
    bounds a thinking model's reasoning, as in ``Engine.submit_chat`` (the reply returned holds
    the reasoning, in its tags, before the answer)."""
    renderer = ChatRenderer(ctx.model, chat_template)
    prepared = renderer.prepare(
        messages, mtmd=mtmd, media_budget=media_budget, template_kwargs=chat_template_kwargs, reasoning=reasoning
    )
    sampler = _within_budget(prepared, sampler, json_schema is None and grammar is None)
    if prepared.media is not None and mtmd is not None:
        _check_prompt(prepared.n_tokens, ctx.n_ctx_seq(), images=True, drafts=speculative is not None)
        pieces = stream_media(
            ctx,
            mtmd,
            prepared.media,
            max_tokens=max_tokens,
            sampler=sampler,
            stop=stop,
            seq_id=seq_id,
            json_schema=json_schema,
            grammar=grammar,
        )
        return "".join(pieces)
    return generate(
        ctx,
        prepared.tokens,
        max_tokens=max_tokens,
        sampler=sampler,
        stop=stop,
        seq_id=seq_id,
        json_schema=json_schema,
        grammar=grammar,
        speculative=speculative,
    )


def _within_budget(prepared: PreparedChat, sampler: LlamaSampler | None, free: bool) -> LlamaSampler | None:
    """``sampler`` (greedy when None) after the chat's reasoning budget, when it has one and the
    reply is ``free`` text (a schema or grammar holds the reply from its first token)."""
    if prepared.reasoning_budget is None or not free:
        return sampler
    return LlamaSampler.chain([prepared.reasoning_budget, sampler or LlamaSampler.greedy()])


class ChatSession:
    """A conversation whose history stays in the KV cache of sequence 0 between turns: each
    turn decodes only what follows what the cache already holds (an image shown in an earlier
    turn is not encoded again). With ``mtmd``, a turn's text may be OpenAI's content parts with
    images, as in ``chat``; ``media_budget`` bounds the media of the whole conversation, which
    each turn reads again. ``chat_template``, ``chat_template_kwargs`` and ``reasoning`` (each
    turn's budget) as in ``chat``."""

    def __init__(
        self,
        ctx: LlamaContext,
        *,
        system: str | None = None,
        max_tokens: int = 256,
        mtmd: MtmdContext | None = None,
        media_budget: MediaBudget = MediaBudget(),
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        reasoning: Reasoning = Reasoning(),
    ) -> None:
        self.ctx = ctx
        self.reasoning = reasoning
        self.max_tokens = max_tokens
        self.mtmd = mtmd
        self.media_budget = media_budget
        self.messages: list[Message] = [("system", system)] if system else []
        self._renderer = ChatRenderer(ctx.model, chat_template)
        self._template_kwargs = chat_template_kwargs
        # What sequence 0 holds from position 0 (an image's positions as placeholders).
        self._held: list[int] = []

    def send(
        self,
        text: str | list[dict[str, Any]],
        sampler: LlamaSampler | None = None,
        *,
        speculative: Speculative | None = None,
    ) -> Iterator[str]:
        """Adds the user's ``text`` (a string, or content parts) and yields the reply as it is
        generated (greedy when ``sampler`` is None; ``speculative`` as in ``stream``, for turns
        without images)."""
        user: Message = ("user", text) if isinstance(text, str) else {"role": "user", "content": text}
        messages = [*self.messages, user]
        prepared = self._renderer.prepare(
            messages,
            mtmd=self.mtmd,
            media_budget=self.media_budget,
            template_kwargs=self._template_kwargs,
            reasoning=self.reasoning,
        )
        sampler = _within_budget(prepared, sampler, free=True)
        prompt = prepared.media or MediaPrompt([prepared.tokens], [])
        # The conversation must still fit the context (its images included).
        images, drafts = prepared.media is not None, speculative is not None
        _check_prompt(prepared.n_tokens, self.ctx.n_ctx_seq(), images=images, drafts=drafts)
        reply: list[str] = []
        # The turn reads what follows the start its prompt shares with the sequence, whose
        # contents `continue_from` keeps telling, also after a failed turn (which leaves the
        # conversation as it was).
        turn = continue_from(
            self.ctx,
            self.mtmd,
            prompt,
            self._held,
            max_tokens=self.max_tokens,
            sampler=sampler or LlamaSampler.greedy(),
            speculative=speculative,
        )
        try:
            for piece in turn:
                reply.append(piece)
                yield piece
        except GeneratorExit:
            # The caller stopped reading: what it read is the assistant's turn.
            turn.close()
            self.messages = [*messages, ("assistant", "".join(reply))]
            raise
        self.messages = [*messages, ("assistant", "".join(reply))]
