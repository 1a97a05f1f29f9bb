"""llama-server's rerank API (``/v1/rerank`` and its other paths), in Jina's shape and TEI's, on a
synthetic Qwen3 reranker (``synthetic.write_qwen3_reranker``): each score equal to the library's
``rerank`` of the same pair, the order, ``top_n``, the documents returned, the usage, and the
errors of a server that does not rerank and of bodies it refuses. In process (``create_app``),
and once through ``llamactx serve --reranking``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.serving import running_server

import llamactx
from llamactx import LlamaPoolingType
from llamactx._embedding import embedding_context
from llamactx._llamactx import _rerank_prompt
from llamactx.server import create_app

QUERY = "What is the capital of France?"
DOCUMENTS = ["Bananas are yellow.", "Paris is the capital of France.", "Trains run on rails.", "Paris is big."]


@pytest.fixture(scope="module")
def engine(reranker: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(reranker, n_ctx=512, n_seq_max=1, prefix_cache=False) as served:
        yield served


@pytest.fixture(scope="module")
def rank_ctx(reranker: llamactx.LlamaModel) -> Iterator[llamactx.LlamaContext]:
    ctx = embedding_context(reranker, 4, 512, None, LlamaPoolingType.RANK)
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def scores(rank_ctx: llamactx.LlamaContext) -> list[float]:
    return [float(score) for score in llamactx.rerank(rank_ctx, QUERY, DOCUMENTS)]


def post(app: Any, path: str, body: Any) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await http.post(path, json=body)

    return asyncio.run(run())


def best_first(scores: list[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda index: -scores[index])


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/reranking", "/v1/reranking"])
def test_documents_come_back_best_first_with_the_librarys_scores(
    engine: llamactx.Engine,
    rank_ctx: llamactx.LlamaContext,
    reranker: llamactx.LlamaModel,
    scores: list[float],
    path: str,
) -> None:
    app = create_app(engine, model_id="ranker", embeddings=rank_ctx)
    response = post(app, path, {"model": "ranker", "query": QUERY, "documents": DOCUMENTS})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == "ranker"
    assert answer["object"] == "list"
    assert [result["index"] for result in answer["results"]] == best_first(scores)
    for result in answer["results"]:
        assert result["relevance_score"] == pytest.approx(scores[result["index"]], rel=1e-5)
        assert "document" not in result
    used = sum(len(_rerank_prompt(reranker, QUERY, document)) for document in DOCUMENTS)
    assert answer["usage"] == {"prompt_tokens": used, "total_tokens": used}


def test_top_n_keeps_the_best_and_return_documents_adds_their_text(
    engine: llamactx.Engine, rank_ctx: llamactx.LlamaContext, scores: list[float]
) -> None:
    app = create_app(engine, embeddings=rank_ctx)
    body = {"query": QUERY, "documents": DOCUMENTS, "top_n": 2, "return_documents": True}
    results = post(app, "/v1/rerank", body).json()["results"]
    assert [result["index"] for result in results] == best_first(scores)[:2]
    assert [result["document"] for result in results] == [{"text": DOCUMENTS[i]} for i in best_first(scores)[:2]]


def test_texts_get_text_embeddings_inferences_shape(
    engine: llamactx.Engine, rank_ctx: llamactx.LlamaContext, scores: list[float]
) -> None:
    app = create_app(engine, embeddings=rank_ctx)
    results = post(app, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "return_text": True}).json()
    assert [result["index"] for result in results] == best_first(scores)
    for result in results:
        assert result["score"] == pytest.approx(scores[result["index"]], rel=1e-5)
        assert result["text"] == DOCUMENTS[result["index"]]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"documents": DOCUMENTS}, "query"),
        ({"query": QUERY, "documents": []}, "documents"),
        ({"query": QUERY, "documents": [1, 2]}, "documents"),
        ({"query": QUERY}, "either 'documents' or 'texts'"),
        ({"query": QUERY, "documents": DOCUMENTS, "texts": DOCUMENTS}, "either 'documents' or 'texts'"),
        ({"query": QUERY, "documents": DOCUMENTS, "top_n": -1}, "top_n"),
        ({"query": QUERY, "documents": ["x"] * 1025}, "documents"),
        ({"query": QUERY, "documents": ["Paris " * 600]}, "more than n_ubatch"),
    ],
)
def test_bodies_it_cannot_rank_are_400s_naming_the_field(
    engine: llamactx.Engine, rank_ctx: llamactx.LlamaContext, body: dict[str, Any], named: str
) -> None:
    response = post(create_app(engine, embeddings=rank_ctx), "/v1/rerank", body)
    assert response.status_code == 400
    assert named in response.text


def test_a_server_without_a_reranking_context_answers_501_and_embeddings_refuse_rank(
    engine: llamactx.Engine, reranker: llamactx.LlamaModel, rank_ctx: llamactx.LlamaContext
) -> None:
    mean = embedding_context(reranker, 1, 512, None)
    for embeddings in (None, mean):
        response = post(create_app(engine, embeddings=embeddings), "/v1/rerank", {"query": QUERY, "texts": ["x"]})
        assert response.status_code == 501
        assert response.json()["error"]["type"] == "not_supported_error"
        assert "--reranking" in response.json()["error"]["message"]
    mean.close()
    response = post(create_app(engine, embeddings=rank_ctx), "/v1/embeddings", {"input": "hello"})
    assert response.status_code == 400
    assert "rerank() reads them" in response.text


def test_serve_reranking_answers_rerank_requests(reranker_path: Path, scores: list[float]) -> None:
    with running_server(reranker_path, "--reranking", "--ctx-size", "512", "--parallel", "1") as server:
        response = httpx.post(f"{server.url}/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}, timeout=60)
    assert response.status_code == 200, response.text
    ranked = response.json()["results"]
    assert [result["index"] for result in ranked] == best_first(scores)
    assert [result["relevance_score"] for result in ranked] == pytest.approx(
        [scores[i] for i in best_first(scores)], rel=1e-4
    )
