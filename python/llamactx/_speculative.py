"""Speculative decoding's options: ``NgramDraft``, for ``Engine``, ``stream``, ``generate`` and
``ChatSession``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_NGRAM", "NgramDraft"]

#: The longest n-gram and draft ``NgramDraft`` takes.
MAX_NGRAM = 256


@dataclass(frozen=True)
class NgramDraft:
    """Speculative decoding by n-gram lookup, for ``Engine(speculative=...)``: where the last
    ``size_ngram`` tokens of a request (its prompt and output so far) occurred before, the up
    to ``size_mgram`` tokens that followed them then are proposed, and the engine verifies them
    all in one decode (in ``stream``, ``generate`` and ``ChatSession.send`` too, with their
    ``speculative`` argument). No second model; it pays where the output repeats its input (code
    edits, quotes, extraction, answers from a given document). The output is the same as
    without it: each token is still sampled by the request's own sampler. How many tokens a
    request drafts adapts to how many were accepted. (llama.cpp's ``ngram-simple``.)

    With ``only_where_faster`` (the default), the engine drafts at a number of running requests
    only while its steps with drafts measured more tokens per second there than its steps
    without (one step in 16 takes the other choice, to keep measuring both): on a CPU, a decode
    of several sequences is already bound by compute, and verifying drafts there can cost more
    than it saves. ``False`` drafts at every step. ``stream``, ``generate`` and ``ChatSession``
    draft at every step."""

    size_ngram: int = 3
    size_mgram: int = 16
    only_where_faster: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.size_ngram <= MAX_NGRAM:
            raise ValueError(f"size_ngram must be in 1..={MAX_NGRAM}, got {self.size_ngram}")
        if not self.size_ngram <= self.size_mgram <= MAX_NGRAM:
            raise ValueError(f"size_mgram must be in size_ngram..={MAX_NGRAM}, got {self.size_mgram}")
