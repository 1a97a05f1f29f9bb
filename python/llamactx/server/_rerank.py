"""llama-server's rerank API on the pipeline's reranking context: ``/v1/rerank`` (also
``/rerank``, ``/reranking`` and ``/v1/reranking``), in Jina's shape (``documents``; results
``{index, relevance_score}``) or, for a body with ``texts``, Hugging Face TEI's (a bare list of
``{index, score}``)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from pydantic import Field, model_validator
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from llamactx._enums import LlamaPoolingType
from llamactx._llamactx import _rerank_prompt
from llamactx._rerank import pair_scores, ranking
from llamactx.server._api import OPENAI_PREFIXES, Api
from llamactx.server._errors import ApiError, openai_error
from llamactx.server._openai_protocol import _Body
from llamactx.server._pipeline import Pipeline

__all__ = ["Rerank", "RerankRequest"]

#: Documents one request may rank (each pair is decoded whole, so this bounds the work with the
#: body's size).
MAX_DOCUMENTS = 1024

Documents = Annotated[list[str], Field(min_length=1, max_length=MAX_DOCUMENTS)]


class RerankRequest(_Body):
    """``POST /v1/rerank``: ``documents`` (Jina's, Cohere's) or ``texts`` (TEI's) ranked by
    relevance to ``query``; ``top_n`` keeps the best; ``return_documents`` (Jina's) adds each
    result's ``document: {"text"}``, ``return_text`` (TEI's) its ``text``."""

    model: str | None = None
    query: str
    documents: Documents | None = None
    texts: Documents | None = None
    top_n: Annotated[int, Field(ge=0)] | None = None
    return_documents: bool = False
    return_text: bool = False

    @model_validator(mode="after")
    def _one_list(self) -> RerankRequest:
        if (self.documents is None) == (self.texts is None):
            raise ValueError("give the texts to rank as either 'documents' or 'texts'")
        return self


class Rerank:
    """The rerank endpoints on ``pipeline``, scored by its context when that pools by RANK."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def api(self) -> Api:
        """The rerank routes, under ``/v1`` and at the root (as llama-server serves them)."""
        routes = [("POST", path, self.rerank_route) for path in ("/rerank", "/reranking")]
        return Api(routes, prefixes=OPENAI_PREFIXES)

    async def rerank_route(self, http: HttpRequest) -> Response:
        body = await self.pipeline.body(http, RerankRequest)
        context = self.pipeline.embeddings
        if context is None or context.pooling_type() != LlamaPoolingType.RANK:
            raise ApiError(501, "this server does not rerank: start it with --reranking and a reranker model")
        tei = body.texts is not None
        documents = body.texts if body.texts is not None else body.documents or []
        try:
            scores, used = await asyncio.to_thread(self._scores, body.query, documents)
        except Exception as error:
            raise openai_error(error, "the documents cannot be ranked", "texts" if tei else "documents") from None
        results: list[dict[str, Any]] = []
        for index in ranking(scores, body.top_n):
            result: dict[str, Any] = {"index": index, "score" if tei else "relevance_score": scores[index]}
            if tei and body.return_text:
                result["text"] = documents[index]
            if not tei and body.return_documents:
                result["document"] = {"text": documents[index]}
            results.append(result)
        if tei:
            return JSONResponse(results)
        usage = {"prompt_tokens": used, "total_tokens": used}
        return JSONResponse({"model": self.pipeline.model_id, "object": "list", "usage": usage, "results": results})

    def _scores(self, query: str, documents: list[str]) -> tuple[list[float], int]:
        """Each document's score and the tokens of all the pairs."""
        context = self.pipeline.embeddings
        assert context is not None  # the route checked it
        prompts = [_rerank_prompt(context.model, query, document) for document in documents]
        with self.pipeline.embeddings_lock:
            scores = pair_scores(context, prompts, documents)
        return [float(score) for score in scores], sum(map(len, prompts))
