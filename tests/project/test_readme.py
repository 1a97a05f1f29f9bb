"""The README's Python examples run as written."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from support import loopback_only, synthetic
from support.images import random_png
from support.rpc_serving import rpc_servers
from support.serving import running_server

import llamactx

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


# The server example's address, and the command the README starts that server with.
SERVER_URL = "http://127.0.0.1:8000"
SERVE_COMMAND = "llamactx serve --port 8000"
# The RPC example's servers, started as the README says, on free ports.
RPC_ENDPOINTS = ("127.0.0.1:50052", "127.0.0.1:50053")


@pytest.mark.parametrize(
    "code", [pytest.param(code, marks=pytest.mark.long) if "import ray" in code else code for code in EXAMPLES]
)
def test_readme_example_runs(
    code: str, capsys: pytest.CaptureFixture[str], model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if SERVER_URL in code:
        # The README's command, on a free port instead of 8000.
        with running_server(model_path) as server:
            exec(compile(code.replace(SERVER_URL, server.url), str(README), "exec"), {})
    elif "import ray" in code:
        # Ray's servers listen on every interface: the example runs where loopback is the only one.
        example = tmp_path / "example.py"
        example.write_text(code)
        done = subprocess.run(loopback_only.command(str(example)), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        print(done.stdout)
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
