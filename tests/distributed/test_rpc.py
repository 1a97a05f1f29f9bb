"""Models on llama.cpp RPC servers (``llamactx rpc-server``, on loopback): the same text and
logits as the local model, the engine on them, and typed errors (never an abort) for a server
that is unreachable, silent, of another protocol version, or killed mid-decode."""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from support.decoding import decode_prompt
from support.processes import CHILDREN
from support.prompts import PARIS_PROMPT
from support.rpc_serving import free_port, rpc_server, rpc_servers
from support.serving import stop

import llamactx

PROMPTS = [PARIS_PROMPT, "One, two, three, four,", "The opposite of hot is", "Water boils at"]


@pytest.fixture
def two_servers() -> Iterator[list[str]]:
    with rpc_servers(2) as servers:
        yield [server.endpoint for server in servers]


def greedy(model: llamactx.LlamaModel, prompt: str, max_tokens: int = 24) -> str:
    with model.new_context(n_ctx=512) as ctx:
        return llamactx.generate(ctx, prompt, max_tokens=max_tokens)


def last_logits(model: llamactx.LlamaModel, prompt: str) -> np.ndarray:
    with model.new_context(n_ctx=512) as ctx:
        decode_prompt(ctx, model.str_to_token(prompt, False))
        return np.array(ctx.get_logits_ith(-1))


def test_layers_on_two_servers_give_the_local_text_and_logits(
    model: llamactx.LlamaModel, model_path: Path, two_servers: list[str]
) -> None:
    with llamactx.LlamaModel.load_from_file(model_path, rpc_servers=two_servers) as remote:
        parts = remote.devices()
        assert [part["endpoint"] for part in parts] == [*two_servers, None]
        assert [part["kind"] for part in parts] == ["rpc", "rpc", "cpu"]
        # The layers went to the servers, some to each.
        assert all(part["weight_bytes"] > 10_000_000 for part in parts[:2])
        assert sum(part["weight_bytes"] for part in parts[:2]) > 0.8 * remote.model_size()
        for prompt in PROMPTS[:2]:
            assert greedy(remote, prompt) == greedy(model, prompt)
        difference = np.abs(last_logits(remote, PARIS_PROMPT) - last_logits(model, PARIS_PROMPT)).max()
        assert difference < 1e-3


def test_the_engine_serves_four_concurrent_requests_over_rpc(
    model: llamactx.LlamaModel, model_path: Path, two_servers: list[str]
) -> None:
    expected = [greedy(model, prompt, 32) for prompt in PROMPTS]
    with (
        llamactx.LlamaModel.load_from_file(model_path, rpc_servers=two_servers) as remote,
        llamactx.Engine(remote, n_ctx=2048, n_seq_max=4) as engine,
        ThreadPoolExecutor(4) as callers,
    ):
        requests = list(callers.map(lambda prompt: engine.submit(prompt, max_tokens=32), PROMPTS))
        assert [request.result(timeout=120).text for request in requests] == expected


def test_a_local_model_loaded_after_an_rpc_one_stays_local(model_path: Path, two_servers: list[str]) -> None:
    with llamactx.LlamaModel.load_from_file(model_path, rpc_servers=two_servers[:1]):
        pass
    local = llamactx.LlamaModel.load_from_file(model_path)
    assert [part["kind"] for part in local.devices()] == ["cpu"]
    assert local.devices()[0]["weight_bytes"] == local.model_size()


def test_killing_a_server_mid_decode_raises_and_the_survivor_reloads(model_path: Path) -> None:
    with rpc_servers(2) as (kept, killed):
        child = subprocess.Popen(
            [sys.executable, str(CHILDREN / "rpc_client.py"), str(model_path), "server_killed_mid_decode"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines = _lines(child)
        assert child.stdin is not None
        child.stdin.write(json.dumps([kept.endpoint, killed.endpoint]) + "\n")
        child.stdin.flush()
        assert lines.get(timeout=120) == "DECODING"
        time.sleep(1.0)  # a few 512-token decodes in
        killed.kill()
        killed_at = time.monotonic()
        raised = lines.get(timeout=30)
        waited = time.monotonic() - killed_at
        rest = [lines.get(timeout=120) for _ in range(2)]
        _, stderr = child.communicate(timeout=60)
    assert child.returncode == 0, stderr[-3000:]
    assert raised.startswith("RAISED"), raised
    assert killed.endpoint in raised
    assert waited < 10
    assert rest == ["REFUSED true", "RELOADED true"]


def test_ctrl_c_ends_a_server_cleanly_while_it_serves(model_path: Path) -> None:
    """Ctrl-C while a client decodes on the servers: each ends with status 0 (its serving thread
    cannot be stopped, and a normal exit's C++ destructors beside it crashed it, SIGSEGV, in
    one stop of 8 to 24 here)."""
    for attempt in range(8):
        with rpc_servers(2) as servers:
            model = llamactx.LlamaModel.load_from_file(model_path, rpc_servers=[s.endpoint for s in servers])
            with model.new_context(n_ctx=512, n_threads=1, n_threads_batch=1) as ctx:

                def generate() -> None:
                    with contextlib.suppress(llamactx.LlamaCppError):
                        llamactx.generate(ctx, PARIS_PROMPT, max_tokens=400)

                client = threading.Thread(target=generate)
                client.start()
                time.sleep(0.3 + 0.1 * attempt)
                for server in servers:
                    stop(server.process, signal.SIGINT, 10)
                client.join(60)
            assert [server.process.returncode for server in servers] == [0, 0], "".join(servers[1].log)


def _lines(child: subprocess.Popen[str]) -> queue.Queue[str]:
    """The child's stdout lines, as they come."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line.strip())

    threading.Thread(target=read, daemon=True).start()
    return lines


@contextmanager
def fake_server(answer: bytes | None) -> Iterator[str]:
    """A loopback listener that reads a HELLO and sends ``answer`` (nothing when None)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(1 + 8 + 24)
            if answer is not None:
                connection.sendall(answer)
            stop.wait(30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def test_an_unreachable_server_is_an_rpc_error_naming_it(model_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(llamactx.RpcError, match=endpoint) as raised:
        llamactx.LlamaModel.load_from_file(model_path, rpc_servers=[endpoint])
    assert raised.value.kind == "ConnectionFailed"
    assert isinstance(raised.value, ConnectionError)


def test_a_server_of_another_protocol_version_is_refused(model_path: Path) -> None:
    hello = (28).to_bytes(8, "little") + bytes([99, 0, 0, 0]) + bytes(24)
    with fake_server(hello) as endpoint, pytest.raises(llamactx.RpcError, match=r"protocol 99\.0\.0") as raised:
        llamactx.LlamaModel.load_from_file(model_path, rpc_servers=[endpoint])
    assert endpoint in str(raised.value)


def test_a_silent_server_times_out(model_path: Path) -> None:
    started = time.monotonic()
    with fake_server(None) as endpoint, pytest.raises(llamactx.RpcError, match="no answer to the handshake within 1 s"):
        llamactx.LlamaModel.load_from_file(model_path, rpc_servers=[endpoint], rpc_timeout=1)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("servers", "kind"),
    [(["nohost"], "InvalidEndpoint"), (["127.0.0.1:0"], "InvalidEndpoint"), ([":50052"], "InvalidEndpoint")],
)
def test_malformed_endpoints_are_refused(model_path: Path, servers: list[str], kind: str) -> None:
    with pytest.raises(llamactx.RpcError, match=servers[0]) as raised:
        llamactx.LlamaModel.load_from_file(model_path, rpc_servers=servers)
    assert raised.value.kind == kind


def test_rpc_arguments_are_checked(model_path: Path) -> None:
    with pytest.raises(ValueError, match="rpc_servers is empty"):
        llamactx.LlamaModel.load_from_file(model_path, rpc_servers=[])
    with pytest.raises(ValueError, match="rpc_timeout"):
        llamactx.LlamaModel.load_from_file(model_path, rpc_servers=["127.0.0.1:1"], rpc_timeout=0)
    with pytest.raises(llamactx.RpcError, match="listed twice"):
        llamactx.LlamaModel.load_from_file(model_path, rpc_servers=["127.0.0.1:9", "127.0.0.1:9"])


def test_the_cli_generates_over_rpc_as_it_does_locally(model_path: Path, two_servers: list[str]) -> None:
    def generate(*extra: str) -> str:
        command = [sys.executable, "-m", "llamactx", "generate", PARIS_PROMPT, "-m", str(model_path), "-n", "8"]
        done = subprocess.run([*command, "--greedy", *extra], capture_output=True, text=True, timeout=300, check=True)
        return done.stdout

    assert generate("--rpc", ",".join(two_servers)) == generate()


def test_the_cli_info_shows_where_the_weights_went(model_path: Path, two_servers: list[str]) -> None:
    command = [sys.executable, "-m", "llamactx", "info", "-m", str(model_path), "--rpc", ",".join(two_servers)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    devices = [line for line in done.stdout.splitlines() if line.startswith("device: ")]
    assert len(devices) == 3
    assert all(f"(rpc) at {endpoint}: " in line for line, endpoint in zip(devices, two_servers, strict=False))
    assert devices[2] == "device: CPU (cpu)"


def test_rpc_server_refuses_a_port_in_use() -> None:
    with rpc_server() as running:
        port = running.endpoint.rsplit(":", 1)[1]
        done = subprocess.run(
            [sys.executable, "-m", "llamactx", "rpc-server", "--port", port],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert "RpcError" in done.stderr
    assert "cannot listen" in done.stderr
