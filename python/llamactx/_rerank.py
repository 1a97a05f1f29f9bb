"""Reranking: how relevant each document is to a query, scored by a reranker model (a
classification head read by llama.cpp's RANK pooling), as llama-server's ``/v1/rerank``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from llamactx._embedding import pooled_outputs
from llamactx._enums import LlamaPoolingType
from llamactx._llamactx import LlamaContext, _rerank_prompt

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["pair_scores", "ranking", "rerank"]


def rerank(ctx: LlamaContext, query: str, documents: Sequence[str]) -> npt.NDArray[np.float32]:
    """Scores each of ``documents`` for ``query``: a new float32 array, one score per document, in
    their order (higher is more relevant), as llama-server's ``/v1/rerank`` scores them.

    ``ctx`` must be a reranker's context made with ``embeddings=True`` and
    ``pooling_type=LlamaPoolingType.RANK`` (``ValueError`` for another pooling; ``EmbeddingsError`` without embeddings).
    Each pair's prompt is the model's ``rerank`` template (GGUF's ``tokenizer.chat_template.rerank``)
    with ``{query}`` and ``{document}`` filled in, or ``[BOS] query [EOS] [SEP] document [EOS]``
    without one; the query and documents are always text (special-token text in them is not
    parsed as special tokens). A pair's score is the first output of the model's classification
    head (for Qwen3 rerankers, the softmax's probability of "yes"). Pairs are packed several per
    decode, as ``embed`` packs texts; ``ValueError`` for a pair longer than ``n_ubatch``. The KV
    cache of ``ctx`` is cleared.
    """
    return pair_scores(ctx, [_rerank_prompt(ctx.model, query, document) for document in documents], documents)


def pair_scores(ctx: LlamaContext, prompts: list[list[int]], documents: Sequence[str]) -> npt.NDArray[np.float32]:
    """``rerank``'s scores of pairs already made into ``prompts`` (``_rerank_prompt``'s tokens,
    one per document of ``documents``, which name them in errors)."""
    if ctx.pooling_type() != LlamaPoolingType.RANK:
        raise ValueError("rerank needs a context made with embeddings=True and pooling_type=LlamaPoolingType.RANK")
    scores: npt.NDArray[np.float32] = pooled_outputs(ctx, prompts, documents, 1)[:, 0].copy()
    return scores


def ranking(scores: Sequence[float], top_n: int | None = None) -> list[int]:
    """The documents' indices from the best score to the worst (ties in the documents' order),
    the first ``top_n`` of them (all for None): the order llama-server's results come in."""
    return sorted(range(len(scores)), key=lambda index: -scores[index])[:top_n]
