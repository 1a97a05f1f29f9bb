"""Chat with the model's own chat template."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence

from llamactx._constraints import JsonSchema
from llamactx._generation import continue_sequence, generate, prefill
from llamactx._llamactx import LlamaContext, LlamaModel, LlamaSampler
from llamactx._tools import turns

__all__ = ["ChatSession", "chat", "template_tokens"]

Message = Mapping[str, str] | tuple[str, str]

#: Stands for message ``N``'s text while the template is rendered: private-use characters, which
#: no template writes itself.
_SLOT = "\ue000{}\ue001"
_SLOTS = re.compile("\ue000([0-9]+)\ue001")


def template_tokens(model: LlamaModel, messages: Sequence[tuple[str, str]], *, add_bos: bool = False) -> list[int]:
    """``messages`` in the model's chat template, ready for the assistant's reply, as tokens:
    special tokens (``<|im_start|>``) are parsed in what the template writes, never in the
    messages' text, so no message can open a turn of its own.

    The template is rendered once with a placeholder for each text, to find where the template
    puts it, and once with the texts; a template that changes a text other than by trimming its
    whitespace is refused with ``ValueError`` (its text could not be told from the template's)."""
    prompt = model.apply_chat_template(messages, None, True)
    shaped = model.apply_chat_template(
        [(role, _SLOT.format(index) if text else text) for index, (role, text) in enumerate(messages)], None, True
    )
    pieces = _SLOTS.split(shaped)
    tokens: list[int] = []
    at = 0
    for number in range(0, len(pieces) - 1, 2):
        frame, text = pieces[number], messages[int(pieces[number + 1])][1]
        if not prompt.startswith(frame, at):
            raise ValueError("the chat template renders messages in a way llamactx cannot tokenize safely")
        at += len(frame)
        text = _as_rendered(prompt, at, text, pieces[number + 2])
        tokens += model.str_to_token(frame, add_bos and not tokens)
        tokens += model.str_to_token(text, add_bos and not tokens, special=False)
        at += len(text)
    if prompt[at:] != pieces[-1]:
        raise ValueError("the chat template renders messages in a way llamactx cannot tokenize safely")
    return tokens + model.str_to_token(pieces[-1], add_bos and not tokens)


def _as_rendered(prompt: str, at: int, text: str, frame_after: str) -> str:
    """``text`` as the template wrote it at ``at`` of ``prompt``: whole, or without the
    whitespace some templates trim."""
    for shown in (text, text.strip(), text.lstrip(), text.rstrip()):
        if prompt.startswith(shown, at) and prompt.startswith(frame_after, at + len(shown)):
            return shown
    raise ValueError("the chat template changes message text: its special tokens could not be told from the text's")


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
) -> str:
    """The assistant's reply to ``messages`` (``{"role", "content"}`` dicts or pairs), formatted
    with the model's chat template; greedy when ``sampler`` is None. ``json_schema`` and
    ``grammar`` constrain the reply, as in ``stream``."""
    model = ctx.model
    prompt = template_tokens(model, turns(messages), add_bos=model.add_bos_token())
    return generate(
        ctx,
        prompt,
        max_tokens=max_tokens,
        sampler=sampler,
        stop=stop,
        seq_id=seq_id,
        json_schema=json_schema,
        grammar=grammar,
    )


class ChatSession:
    """A conversation whose history stays in the KV cache of sequence 0 between turns: each
    turn decodes only the tokens that follow what the cache already holds."""

    def __init__(self, ctx: LlamaContext, *, system: str | None = None, max_tokens: int = 256) -> None:
        self.ctx = ctx
        self.max_tokens = max_tokens
        self.messages: list[tuple[str, str]] = [("system", system)] if system else []
        self._cached: list[int] = []

    def send(self, text: str, sampler: LlamaSampler | None = None) -> Iterator[str]:
        """Adds the user's ``text`` and yields the reply as it is generated (greedy when
        ``sampler`` is None)."""
        model = self.ctx.model
        messages = [*self.messages, ("user", text)]
        tokens = template_tokens(model, messages)
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
                self.ctx, tokens, max_tokens=self.max_tokens, sampler=sampler or LlamaSampler.greedy()
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
