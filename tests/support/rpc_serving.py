"""``llamactx rpc-server`` in child processes for the tests and the benchmark: loopback, free
ports, stopped with Ctrl-C (SIGINT) when the block ends, and with SIGTERM if pytest dies."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from support.serving import die_with_parent, stop

STARTUP_SECONDS = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class RpcServer:
    """A running RPC server: its ``host:port``, process and what it printed."""

    endpoint: str
    process: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)

    def kill(self) -> None:
        """Kills the server as a crash would (SIGKILL): its connections just close."""
        self.process.kill()
        self.process.wait()


@contextmanager
def rpc_server(*options: str) -> Iterator[RpcServer]:
    """``llamactx rpc-server --port FREE *options`` until the block ends; the block's end also
    checks that Ctrl-C stopped it cleanly (exit status 0) unless the test killed it."""
    port = free_port()
    command = [sys.executable, "-m", "llamactx", "rpc-server", "--port", str(port), *options]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=die_with_parent,
    )
    server = RpcServer(f"127.0.0.1:{port}", process)
    started = threading.Event()

    def read_output() -> None:  # drained to the end, so the child never blocks on a full pipe
        assert process.stdout is not None
        for line in process.stdout:
            server.log.append(line)
            if "listening on" in line:
                started.set()
        started.set()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        if not started.wait(STARTUP_SECONDS) or process.poll() is not None:
            raise AssertionError(f"the RPC server did not start: {''.join(server.log)}")
        yield server
    finally:
        killed = process.poll() is not None
        if not killed:
            stop(process, signal.SIGINT, 10)
        reader.join(5)
        if process.stdout is not None:
            process.stdout.close()
    if not killed:
        assert process.returncode == 0, f"Ctrl-C did not stop the RPC server cleanly: {''.join(server.log)}"


@contextmanager
def rpc_servers(count: int, *options: str) -> Iterator[list[RpcServer]]:
    """``count`` RPC servers, each on its own port."""
    with ExitStack() as stack:
        yield [stack.enter_context(rpc_server(*options)) for _ in range(count)]
