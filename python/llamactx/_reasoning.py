"""A thinking model's reasoning: how a chat hands it back (``Reasoning``, llama-server's
``--reasoning-format`` and ``--reasoning-budget``), and its split from the reply's content as
the reply streams (``ReplyStream``). The split is llama.cpp's own chat parser, for the
chat's template; nothing here parses the reply itself."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llamactx._llamactx import _REASONING_FORMATS, _check_reasoning

__all__ = ["REASONING_FORMATS", "Reasoning", "ReplyStream", "thinking_kwargs"]

#: llama-server's ``--reasoning-format`` choices: "none" leaves the reasoning in the content
#: (its tags included); "auto" and "deepseek" split it into ``reasoning_content``, streamed as
#: deltas of their own; "deepseek-legacy" splits the whole reply as "deepseek" does, but streams
#: the reasoning inline, in the content's deltas (its tags included).
REASONING_FORMATS: tuple[str, ...] = tuple(_REASONING_FORMATS)


@dataclass(frozen=True)
class Reasoning:
    """How a chat's reasoning is handled, for a template whose replies open a reasoning block
    (``<think>`` ... ``</think>`` and the like, as llama.cpp's analysis of the template finds
    it; other templates ignore this). ``format`` is one of ``REASONING_FORMATS``. ``budget``
    bounds the block: after that many tokens of reasoning, ``budget_message`` and the block's
    closing tag are forced, token by token, and the model goes on to its answer (llama.cpp's
    reasoning-budget sampler; None: unbounded, llama-server's -1; 0 closes the block at once).
    A budget needs the reply to be free text: a ``json_schema`` or ``grammar`` constrains the
    reply from its first token, and then no block opens. ``ValueError`` for an unknown format
    or a budget below 0."""

    format: str = "auto"
    budget: int | None = None
    budget_message: str = ""

    def __post_init__(self) -> None:
        _check_reasoning(self.format, self.budget)  # the checks the renderer reads it with

    @property
    def streams_split(self) -> bool:
        """Whether a streamed reply sends its reasoning as deltas of its own (else inline)."""
        return self.format in ("auto", "deepseek")


class ReplyStream:
    """One streamed reply's deltas: with ``parse`` (the chat's parser), its reasoning and its
    content split as the text grows, by the parser run on the text so far (as llama-server
    does; a tag cut short is held back until it is whole); without, each piece is content.
    ``content=False`` sends no content (a reply constrained to tool calls sends it whole at its
    end). A delta is what the parse adds to what was sent; a parse that takes back what was
    sent sends nothing until it agrees again."""

    def __init__(self, parse: Callable[[str, bool], str] | None, *, content: bool = True) -> None:
        self._parse = parse
        self._content = content
        self._pieces: list[str] = []
        self._sent = {"reasoning_content": "", "content": ""}

    @property
    def splits_reasoning(self) -> bool:
        """Whether the reasoning streams as deltas of its own."""
        return self._parse is not None

    def feed(self, piece: str) -> dict[str, str]:
        """The deltas (``reasoning_content``, ``content``; only those with text) that ``piece``
        adds to the reply."""
        if self._parse is None:
            return {"content": piece} if self._content else {}
        self._pieces.append(piece)
        try:
            message = json.loads(self._parse("".join(self._pieces), True))
        except ValueError:
            return {}
        return self._advance(message)

    def rest(self, message: dict[str, Any]) -> dict[str, str]:
        """The deltas that finish the reply whose whole message is ``message``."""
        return {} if self._parse is None else self._advance(message)

    def _advance(self, message: dict[str, Any]) -> dict[str, str]:
        delta: dict[str, str] = {}
        for key in ("reasoning_content", "content") if self._content else ("reasoning_content",):
            now = message.get(key) or ""
            sent = self._sent[key]
            if len(now) > len(sent) and now.startswith(sent):
                delta[key] = now[len(sent) :]
                self._sent[key] = now
        return delta


def thinking_kwargs(kwargs: dict[str, Any] | None, thinking: str, effort: str) -> dict[str, Any]:
    """Template variables: ``kwargs`` with llama-server's ``--reasoning`` (``thinking`` "on" or
    "off": ``enable_thinking``; "auto" leaves it) and ``--reasoning-effort`` (``effort``:
    ``reasoning_effort``; "default" leaves it) over them."""
    variables = dict(kwargs or {})
    if thinking != "auto":
        variables["enable_thinking"] = thinking == "on"
    if effort != "default":
        variables["reasoning_effort"] = effort
    return variables
