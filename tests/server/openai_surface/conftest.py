"""The server under test, one for the whole suite: ``llamactx serve`` on the default model, or
llama.cpp's own server on the same model when ``LLAMACTX_SUITE_PEER_PYTHON`` names a Python with
``xllamacpp``; both with the same context, slots and threads. Its clients (raw HTTP, as
llama.cpp's harness sends, and the official SDK), and the model's vocabulary, which says how many
tokens a prompt holds."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import httpx2
import openai
import pytest
from support.serving import running_server

import llamactx

from .markers import PEER_PYTHON
from .peer import running_peer

CTX = 1024
PARALLEL = 2
#: The tokens one request may hold: both servers split the context across their slots.
N_CTX_SEQ = CTX // PARALLEL
#: One compute thread: the suite's replies are short, and two threads on cores other processes use
#: too wait for each other in llama.cpp's spinning barrier (measured on 2 shared cores: 6 times
#: slower than one).
THREADS = 1
OPTIONS = ("--ctx", str(CTX), "--parallel", str(PARALLEL), "--threads", str(THREADS))
TIMEOUT_SECONDS = 120
#: A connection per request: llama-server's HTTP library closes kept-alive connections after a few
#: requests, and a request sent on one as it closes fails ("Server disconnected").
FRESH_CONNECTIONS = httpx.Limits(max_keepalive_connections=0)


@pytest.fixture(scope="package")
def server_url(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL (no ``/v1``) of the server under test; llamactx's also serves embeddings."""
    peer = os.environ.get(PEER_PYTHON)
    if peer:
        log = tmp_path_factory.mktemp("llama-server") / "stderr.log"
        with running_peer(peer, model_path, log, *OPTIONS) as url:
            yield url
    else:
        with running_server(model_path, *OPTIONS, "--embeddings") as server:
            yield server.url


@pytest.fixture(scope="package")
def embeddings_url(server_url: str, model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Where the server under test serves embeddings: llama-server needs a second server, which
    serves nothing else."""
    peer = os.environ.get(PEER_PYTHON)
    if not peer:
        yield server_url
        return
    log = tmp_path_factory.mktemp("llama-server-embeddings") / "stderr.log"
    with running_peer(peer, model_path, log, *OPTIONS, "--embeddings") as url:
        yield url


@pytest.fixture(scope="package")
def http(server_url: str) -> Iterator[httpx.Client]:
    with _http_client(server_url) as client:
        yield client


@pytest.fixture(scope="package")
def api(server_url: str) -> Iterator[openai.OpenAI]:
    """The official client, as llama.cpp's tests make it (base URL with ``/v1``, a dummy key)."""
    with _openai_client(server_url) as client:
        yield client


@pytest.fixture(scope="package")
def embeddings_http(embeddings_url: str) -> Iterator[httpx.Client]:
    with _http_client(embeddings_url) as client:
        yield client


@pytest.fixture(scope="package")
def embeddings_api(embeddings_url: str) -> Iterator[openai.OpenAI]:
    with _openai_client(embeddings_url) as client:
        yield client


def _http_client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=TIMEOUT_SECONDS, limits=FRESH_CONNECTIONS)


def _openai_client(url: str) -> openai.OpenAI:
    # The official client's HTTP library is httpx2, with limits of its own type.
    connections = openai.DefaultHttpxClient(limits=httpx2.Limits(max_keepalive_connections=0))
    return openai.OpenAI(
        base_url=f"{url}/v1", api_key="dummy", max_retries=0, timeout=TIMEOUT_SECONDS, http_client=connections
    )


@pytest.fixture(scope="package")
def vocab(model_path: Path) -> llamactx.LlamaModel:
    """The served model's tokenizer and chat template (no weights)."""
    return llamactx.LlamaModel.load_from_file(model_path, vocab_only=True)
