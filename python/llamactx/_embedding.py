"""Sentence embeddings: many texts packed into few decodes, one sequence per text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from llamactx._enums import LlamaPoolingType
from llamactx._llamactx import LlamaBatch, LlamaContext, LlamaModel, _vocabulary_ids

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["embed", "embedding_context", "input_tokens", "pooled_outputs"]


def _pack(lengths: list[int], max_tokens: int, max_sequences: int) -> list[list[int]]:
    """Groups text indices so each group fits one micro-batch and the context's sequences."""
    groups: list[list[int]] = [[]]
    used = 0
    for index, length in enumerate(lengths):
        if groups[-1] and (used + length > max_tokens or len(groups[-1]) == max_sequences):
            groups.append([])
            used = 0
        groups[-1].append(index)
        used += length
    return groups


def embed(
    ctx: LlamaContext, texts: Sequence[str | Sequence[int]], *, normalize: bool = True
) -> npt.NDArray[np.float32]:
    """Embeds ``texts``: a new float32 array of shape ``(len(texts), n_embd)``. Each is a text
    (tokenized with the model's BOS) or the token ids to embed as they are (``ValueError`` for an
    id outside the vocabulary).

    ``ctx`` must be made with ``embeddings=True``. With a pooling type (MEAN, CLS, LAST) the
    model's pooled vector is used; without one (``LlamaPoolingType.NONE``) the token vectors
    are averaged. Texts are packed several per decode, each in its own sequence, up to
    ``n_ubatch`` tokens and ``n_seq_max`` sequences per decode (a text longer than ``n_ubatch``
    raises ``ValueError``; so does a context pooled by RANK, whose outputs are a reranker's
    scores: see ``rerank``). The KV cache of ``ctx`` is cleared. ``normalize`` scales each row
    to unit length.
    """
    if ctx.pooling_type() == LlamaPoolingType.RANK:
        raise ValueError("this context pools by RANK, into a reranker's scores: rerank() reads them, embed() cannot")
    model = ctx.model
    out = pooled_outputs(ctx, [input_tokens(model, text) for text in texts], texts, model.n_embd())
    if normalize:
        import numpy as np

        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out /= np.where(norms == 0, 1, norms)
    return out


def pooled_outputs(
    ctx: LlamaContext, token_lists: list[list[int]], inputs: Sequence[object], width: int
) -> npt.NDArray[np.float32]:
    """The first ``width`` values of each token list's pooled output (a float32 array of shape
    ``(len(token_lists), width)``), or, for a context that does not pool, of the mean of its
    token vectors: each list decoded in a sequence of its own, several per decode (see ``embed``).
    ``inputs`` name the lists in errors. The KV cache of ``ctx`` is cleared."""
    import numpy as np  # here: importing numpy takes longer than importing llamactx without it

    pooled = ctx.pooling_type() not in (LlamaPoolingType.NONE, LlamaPoolingType.UNSPECIFIED)
    n_ubatch = ctx.n_ubatch()
    for text, tokens in zip(inputs, token_lists, strict=True):
        if not tokens:
            raise ValueError(f"input {text!r} has no tokens")
        if len(tokens) > n_ubatch:
            raise ValueError(f"a text has {len(tokens)} tokens, more than n_ubatch ({n_ubatch})")
    out = np.empty((len(token_lists), width), dtype=np.float32)
    for group in _pack([len(t) for t in token_lists], n_ubatch, ctx.n_seq_max()):
        ctx.clear_kv_cache()
        batch = LlamaBatch(sum(len(token_lists[i]) for i in group), 1)
        rows: list[tuple[int, int, int]] = []  # (text, first row, end row)
        for seq_id, index in enumerate(group):
            first = batch.n_tokens()
            for pos, token in enumerate(token_lists[index]):
                batch.add(token, pos, [seq_id], True)
            rows.append((index, first, batch.n_tokens()))
        ctx.decode(batch)
        for seq_id, (index, first, end) in enumerate(rows):
            if pooled:
                out[index] = ctx.embeddings_seq_ith(seq_id)[:width]
            else:
                out[index] = np.mean([ctx.embeddings_ith(row)[:width] for row in range(first, end)], axis=0)
    ctx.clear_kv_cache()
    return out


def input_tokens(model: LlamaModel, text: str | Sequence[int]) -> list[int]:
    """The tokens ``embed`` decodes for one input: a text's with BOS, or the ids given."""
    if isinstance(text, str):
        return model.str_to_token(text, True)
    return _vocabulary_ids(model, text)


def embedding_context(
    model: LlamaModel,
    n_seq: int,
    n_ubatch: int,
    threads: int | None,
    pooling: LlamaPoolingType = LlamaPoolingType.MEAN,
) -> LlamaContext:
    """A context for ``embed`` (the command line's, the server's and Ray's): ``n_seq`` texts of
    up to ``n_ubatch`` tokens per decode, pooled by their mean; with ``pooling`` RANK, a
    reranker's for ``rerank``."""
    n_ubatch_used = n_ubatch - n_ubatch % n_seq or n_seq
    return model.new_context(
        n_ctx=max(n_ubatch, 256) * n_seq,
        n_batch=n_ubatch_used,
        n_ubatch=n_ubatch_used,
        n_seq_max=n_seq,
        embeddings=True,
        pooling_type=pooling,
        n_threads=threads,
        n_threads_batch=threads,
    )
