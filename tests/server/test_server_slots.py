"""llama-server's slot actions (``POST /slots/{id}?action=save|restore|erase``, with
``SlotFiles`` / ``--slot-save-path``) and the prompt cache kept across restarts
(``serve --prompt-cache-dir``): a restored slot serves its prompt from the cache, as the usage's
``cached_tokens`` shows, and names that would leave the directory are refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.serving import running_server

import llamactx
from llamactx.server import SlotFiles, create_app

SYSTEM = "You are a patient guide to the history of European cities. " * 12
PROMPT = SYSTEM + "Question: which city is the capital of France? Answer:"


@pytest.fixture(scope="module")
def engine(model: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    with llamactx.Engine(model, n_ctx=1024, n_seq_max=2) as served:
        yield served


def calls(app: Any, *requests: tuple[str, dict[str, Any]]) -> list[httpx.Response]:
    """Each ``(path, body)`` posted in turn."""

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return [await http.post(path, json=body) for path, body in requests]

    return asyncio.run(run())


async def _get(app: Any, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        return await http.get(path)


def completion(prompt: str) -> tuple[str, dict[str, Any]]:
    return "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0}


def test_a_saved_slot_restored_serves_its_prompt_from_the_cache(
    engine: llamactx.Engine, model: llamactx.LlamaModel, tmp_path: Path
) -> None:
    files = tmp_path / "slots"  # made by the first save
    app = create_app(engine, slot_files=SlotFiles(files))
    first, saved = calls(app, completion(PROMPT), ("/slots/0?action=save", {"filename": "guide.bin"}))
    assert saved.status_code == 200, saved.text
    answer = saved.json()
    n_prompt = first.json()["usage"]["prompt_tokens"]
    assert (answer["id_slot"], answer["filename"]) == (0, "guide.bin")
    assert answer["n_saved"] == n_prompt + first.json()["usage"]["completion_tokens"] - 1
    assert answer["n_written"] == (files / "guide.bin").stat().st_size
    assert answer["timings"]["save_ms"] >= 0
    erased, restored, again = calls(
        app,
        ("/slots/0?action=erase", {}),
        ("/slots/1?action=restore", {"filename": "guide.bin"}),
        completion(PROMPT),
    )
    assert erased.json() == {"id_slot": 0, "n_erased": answer["n_saved"]}
    listed = asyncio.run(_get(app, "/slots")).json()
    assert listed == [
        {"id": 0, "n_ctx": engine.n_ctx_seq, "is_processing": False, "n_tokens": 0},
        {"id": 1, "n_ctx": engine.n_ctx_seq, "is_processing": False, "n_tokens": answer["n_saved"]},
    ]
    assert restored.json()["n_restored"] == answer["n_saved"]
    assert restored.json()["n_read"] == answer["n_written"]
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1


@pytest.mark.parametrize(
    ("path", "body", "status", "named"),
    [
        ("/slots/0?action=save", {"filename": "../escape.bin"}, 400, "plain name"),
        ("/slots/0?action=save", {"filename": "/etc/passwd"}, 400, "plain name"),
        ("/slots/0?action=save", {"filename": ".hidden"}, 400, "plain name"),
        ("/slots/0?action=restore", {"filename": "missing.bin"}, 404, "no slot file"),
        ("/slots/0?action=restore", {}, 400, "filename"),
        ("/slots/7?action=save", {"filename": "x.bin"}, 400, "slot 7"),
        ("/slots/zero?action=save", {"filename": "x.bin"}, 400, "integer"),
        ("/slots/0?action=copy", {"filename": "x.bin"}, 400, "unknown action"),
    ],
)
def test_slot_actions_it_cannot_do_are_refused_naming_why(
    engine: llamactx.Engine, tmp_path: Path, path: str, body: dict[str, Any], status: int, named: str
) -> None:
    files = tmp_path / "slots"
    files.mkdir()
    (response,) = calls(create_app(engine, slot_files=SlotFiles(files)), (path, body))
    assert response.status_code == status, response.text
    assert named in response.text
    assert list(files.iterdir()) == []
    assert not (tmp_path / "escape.bin").exists()


def test_without_a_slot_directory_save_and_restore_answer_501(engine: llamactx.Engine) -> None:
    save, erase = calls(
        create_app(engine), ("/slots/0?action=save", {"filename": "x.bin"}), ("/slots/0?action=erase", {})
    )
    assert save.status_code == 501
    assert "--slot-save-path" in save.json()["error"]["message"]
    assert erase.status_code == 200


def test_a_restarted_server_answers_from_the_prompt_cache_it_saved(model_path: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    options = ("--prompt-cache-dir", str(cache), "--ctx-size", "1024", "--parallel", "2")
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    with running_server(model_path, *options) as server:
        cold = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert len(list(cache.iterdir())) == 1
    with running_server(model_path, *options) as server:
        warm = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
        log = "".join(server.log)
    assert "1 cached prompts restored" in log
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == cold["usage"]["prompt_tokens"] - 1
