"""The OpenAI-facing parts of llama.cpp's ``unit/test_basic.py``: the server answers ``/health``
and lists its one model (llama.cpp's test names it by an alias it starts the server with; the
servers here keep their default names)."""

from __future__ import annotations

import httpx


def test_server_start_simple(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200


def test_server_models(http: httpx.Client) -> None:
    response = http.get("/models")
    assert response.status_code == 200, response.text
    (model,) = response.json()["data"]
    assert isinstance(model["id"], str)
    assert model["id"]
