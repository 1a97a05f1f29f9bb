"""The README's Python examples run as written (the Ray example with the Ray tests, in
``distributed/ray_cases.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import synthetic
from support.images import random_png
from support.readme import EXAMPLES, RAY_EXAMPLE, README
from support.rpc_serving import rpc_servers
from support.serving import running_server

import llamactx

# The server example's address, and the command the README starts that server with.
SERVER_URL = "http://127.0.0.1:8000"
SERVE_COMMAND = "llamactx serve --port 8000"
# The RPC example's servers, started as the README says, on free ports.
RPC_ENDPOINTS = ("127.0.0.1:50052", "127.0.0.1:50053")


@pytest.mark.parametrize("code", [code for code in EXAMPLES if RAY_EXAMPLE not in code])
def test_readme_example_runs(
    code: str, capsys: pytest.CaptureFixture[str], model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if SERVER_URL in code:
        # The README's command, on a free port instead of 8000.
        with running_server(model_path) as server:
            exec(compile(code.replace(SERVER_URL, server.url), str(README), "exec"), {})
    elif RPC_ENDPOINTS[0] in code:
        with rpc_servers(len(RPC_ENDPOINTS)) as servers:
            for endpoint, server in zip(RPC_ENDPOINTS, servers, strict=True):
                code = code.replace(endpoint, server.endpoint)
            exec(compile(code, str(README), "exec"), {})
    elif "mmproj.gguf" in code:
        # The image example, with the synthetic projector its comment names and a picture.
        model = llamactx.LlamaModel.load_from_file(model_path)
        synthetic.write_tiny_projector(tmp_path / "mmproj.gguf", model.n_embd())
        (tmp_path / "cat.png").write_bytes(random_png(64, 64, 2))
        monkeypatch.chdir(tmp_path)
        exec(compile(code, str(README), "exec"), {})
        printed = capsys.readouterr().out
        half = len(printed) // 2
        assert printed.strip()
        assert printed[:half] == printed[half:]  # the engine's reply is chat's, as its comment says
        return
    else:
        exec(compile(code, str(README), "exec"), {})
    assert "Paris" in capsys.readouterr().out


def test_readme_starts_the_server_its_client_example_uses() -> None:
    text = README.read_text()
    assert SERVE_COMMAND in text
    assert any(SERVER_URL in code for code in EXAMPLES)


def test_readme_has_python_examples() -> None:
    assert EXAMPLES, "README.md lost its Python examples"
