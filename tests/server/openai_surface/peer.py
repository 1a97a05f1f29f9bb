"""llama.cpp's own server (``benches/peer_xllamacpp_server.py``, run by a Python with
``xllamacpp``) in a child process, as ``serving.running_server`` runs ``llamactx serve``."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support.serving import STARTUP_SECONDS, die_with_parent, stop

SCRIPT = Path(__file__).resolve().parents[3] / "benches" / "peer_xllamacpp_server.py"
#: The peer's line once ``/health`` answers.
LISTENING = "listening "


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def running_peer(python: str, model_path: Path, log: Path, *options: str) -> Iterator[str]:
    """llama.cpp's server on ``model_path`` with ``options`` (the script's) until the block ends:
    its base URL; llama.cpp's log goes to ``log``."""
    command = [python, str(SCRIPT), "--model", str(model_path), "--port", str(free_port()), *options]
    with log.open("w") as stderr:
        child = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,  # the peer stops when its stdin ends: with this process
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            preexec_fn=die_with_parent,
        )
    assert child.stdout is not None
    url: list[str] = []
    started = threading.Event()

    def read_stdout() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if not url and line.startswith(LISTENING):
                url.append(line.removeprefix(LISTENING).strip())
                started.set()
        started.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        if not started.wait(STARTUP_SECONDS) or not url:
            raise AssertionError(f"llama.cpp's server did not start: {log.read_text()[-4000:]}")
        yield url[0]
    finally:
        stop(child, signal.SIGTERM, 30)
        reader.join(5)
        child.stdout.close()
        assert child.stdin is not None
        child.stdin.close()
