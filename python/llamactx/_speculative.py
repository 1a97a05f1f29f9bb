"""Speculative decoding's options: ``NgramDraft`` and ``DraftModel``, for ``Engine``,
``stream``, ``generate``, ``chat`` and ``ChatSession``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from llamactx._llamactx import _MAX_DRAFT, _MAX_NGRAM, LlamaModel, _check_speculative

__all__ = ["MAX_DRAFT", "MAX_NGRAM", "DraftModel", "NgramDraft", "Speculative"]

#: The longest n-gram and draft ``NgramDraft`` takes.
MAX_NGRAM = _MAX_NGRAM
#: The longest draft ``DraftModel`` takes.
MAX_DRAFT = _MAX_DRAFT


@dataclass(frozen=True)
class NgramDraft:
    """Speculative decoding by n-gram lookup, for ``Engine(speculative=...)``: where at least
    the last ``size_ngram`` tokens of a request (its prompt and output so far) occurred before,
    the tokens that followed them then are proposed, and the engine verifies them all in one
    decode (in ``stream``, ``generate`` and ``ChatSession.send`` too, with their ``speculative``
    argument). Of the earlier places, the one where the repeat reaches furthest back is taken
    (in a reply that quotes its input, the place being quoted), and a draft is at most half as
    long as that repeat (rounded up) and at most ``size_mgram`` tokens. No second model; it pays
    where the output repeats its input (code edits, quotes, extraction, answers from a given
    document). The output is the same as without it (but at near-ties, see below): each token is
    still sampled by the request's own sampler. How many tokens a request drafts adapts to how many were accepted.
    (Like llama.cpp's ``ngram-simple``, which takes the most recent repeat of exactly
    ``size_ngram`` tokens.) With a KV stream per sequence (``kv_unified=False``, the default),
    an engine's step drafts as many tokens for each of its requests: the fewest any of them
    drafts, so none while one drafts nothing. llama.cpp splits a decode whose sequences bring
    different numbers of tokens into micro-batches that each cost about a decode of their own.

    Near-ties: verifying decodes a token with its draft, and llama.cpp's numbers for a decode of
    several tokens differ a little from decodes of one (by a few hundredths of a logit, up to a
    few tenths, depending on the CPU build's kernels). Where the model's two best candidates are
    that close, a greedy choice (or a seeded draw at the edge of a token's probability) can go
    the other way, and the replies part there; everywhere else they are equal, token for token.

    With ``only_where_faster`` (the default), a request in the engine drafts only while its
    recent drafts had enough of their tokens accepted to pay for their verification, as
    measured on this machine: the engine fits each step's decode time against its tokens, and
    a drafted token pays where the chance it is accepted exceeds what it costs to verify (and
    to find) over what a token costs in a step without drafts. On a GPU that is almost any
    chance; on a CPU, where a decode of several sequences is already bound by compute, about
    half at 1 request and most at 8 (``docs/benchmarks.md``). Until the engine has measured
    decodes of different sizes, only drafts accepted whole pay. A request whose drafts did not
    pay pauses drafting for 2, 4, ... 64 steps, then drafts again to measure. ``False`` drafts
    at every step. ``stream``, ``generate`` and ``ChatSession`` draft at every step."""

    size_ngram: int = 3
    size_mgram: int = 16
    only_where_faster: bool = True

    def __post_init__(self) -> None:
        _check_speculative(self)  # the checks the engine and the drafter read it with


@dataclass(frozen=True)
class DraftModel:
    """Speculative decoding with a draft model, for ``Engine(speculative=...)`` (and
    ``stream``, ``generate``, ``chat``, ``ChatSession.send``): ``model``, smaller than the one
    it drafts for and with the same vocabulary (token for token: ``ValueError`` otherwise, when
    the engine or the generation starts), proposes its most likely next tokens, up to
    ``n_draft_max`` of them and while its probability of each is at least ``p_min``; the target
    model verifies them all in one decode. The output is the same as without it (but at
    near-ties, as for ``NgramDraft``): each token is still sampled by the request's own sampler
    from the target model's output. It pays where the draft model often agrees with the target
    and costs much less per token.

    The engine gives the draft model a context of its own, with the target's cells and
    sequences, and drafts for every generating request in the same decodes; it keeps each
    sequence's tokens there between steps. ``stream``, ``generate`` and ``ChatSession.send``
    open one per call (reading the prompt into it once). How many tokens a request drafts
    adapts to how many were accepted. (llama-server's ``--model-draft``, ``--draft-max`` and
    ``--draft-p-min``, whose defaults these are: with ``p_min`` 0, a draft stops only at
    ``n_draft_max``.) ``only_where_faster`` as in ``NgramDraft``."""

    model: LlamaModel
    n_draft_max: int = 3
    p_min: float = 0.0
    only_where_faster: bool = True

    def __post_init__(self) -> None:
        _check_speculative(self)


#: What the ``speculative`` arguments take.
Speculative: TypeAlias = NgramDraft | DraftModel
