"""``llamactx serve`` in a child process for the tests: loopback, a port the system picks, and
an end tied to the test's (and to pytest's: the child gets SIGTERM if pytest dies)."""

from __future__ import annotations

import ctypes
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from support import no_network

MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"  # the default model's file name, as the server names it
# The engine options of `llamactx serve --no-prefix-cache`, for in-process references.
ENGINE_OPTIONS: dict[str, Any] = {"n_ctx": 4096, "n_seq_max": 8, "prefix_cache": False}
LISTENING = re.compile(r"listening on (http://\S+)")
PR_SET_PDEATHSIG = 1
STARTUP_SECONDS = 60
TESTS = Path(__file__).parents[1]


def die_with_parent() -> None:
    """A ``preexec_fn``: the child gets SIGTERM when the process that started it dies, and
    starts with Ctrl-C's signal unblocked and at its default action, as a shell starts a command
    (a child inherits both, and a test process's may have been changed by what it ran before)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM])
    libc.signal(signal.SIGINT, ctypes.c_void_p(0))  # SIG_DFL: an ignored signal stays ignored across exec


def stop(child: subprocess.Popen[str], how: signal.Signals, seconds: float) -> None:
    """Sends ``how`` and waits ``seconds`` for the child to end, then kills it."""
    child.send_signal(how)
    try:
        child.wait(seconds)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


@dataclass
class Server:
    """A running server: its base URL (no ``/v1``), pid and what it wrote on stderr."""

    url: str
    pid: int
    log: list[str] = field(default_factory=list)

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS line")

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{series: value}`` (labels kept in the series name)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).raise_for_status().text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_until_idle(self, *, seconds: float = 20) -> None:
        """Until the engine runs nothing and holds no KV cells for requests (fails after
        ``seconds``)."""
        deadline = time.monotonic() + seconds
        while True:
            metrics = self.metrics()
            busy = {name: metrics[f"llamactx_engine_{name}"] for name in ("running", "waiting", "kv_cells_used")}
            if not any(busy.values()):
                return
            assert time.monotonic() < deadline, f"still busy: {busy}"
            time.sleep(0.1)


@contextmanager
def running_server(model_path: Path, *options: str, prelude: str = "") -> Iterator[Server]:
    """``llamactx serve --model model_path --port 0 *options`` until the block ends; ``prelude``
    (Python) runs in the server's process first, after the no-network guard (``support/
    no_network.py``): a server that tried to connect outside loopback fails the test at its end."""
    program = (
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom support import no_network\nno_network.install()\n"
        f"{prelude}\nfrom llamactx.cli import main\nsys.exit(main())"
    )
    command = [sys.executable, "-c", program, "serve", "--model", str(model_path), "--port", "0", *options]
    child = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=die_with_parent
    )
    assert child.stderr is not None
    log: list[str] = []
    url: list[str] = []
    started = threading.Event()

    def read_stderr() -> None:  # drained to the end, so the child never blocks on a full pipe
        assert child.stderr is not None
        for line in child.stderr:
            log.append(line)
            if not url and (match := LISTENING.search(line)):
                url.append(match.group(1))
                started.set()
        started.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        if not started.wait(STARTUP_SECONDS) or not url:
            raise AssertionError(f"the server did not start: {''.join(log)}")
        yield Server(url[0], child.pid, log)
    finally:
        stop(child, signal.SIGTERM, 30)
        reader.join(5)
        child.stderr.close()
    assert child.returncode == 0, f"the server exited with {child.returncode}: {''.join(log)}"
    refusals = [line for line in log if no_network.REFUSED in line]
    assert refusals == [], f"the server tried to leave loopback: {refusals}"


#: How long `/health` may take to answer while a hostile request is in flight.
HEALTH_SECONDS = 1.0


def while_polling_health(server: Server, request: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    """``request()``'s response, and the slowest ``/health`` answer while it ran."""
    slowest = [0.0]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            started = time.perf_counter()
            assert httpx.get(f"{server.url}/health", timeout=30).json() == {"status": "ok"}
            slowest[0] = max(slowest[0], time.perf_counter() - started)
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        response = request()
    finally:
        done.set()
        poller.join()
    return response, slowest[0]
