"""A guard against network use in tests: every ``socket.connect`` to an address outside the
loopback range, and every name resolution of a host that is not loopback, is refused
(``PermissionError``) and recorded. The test process installs it (``conftest.py``, failing the
test that tried), and so does every server the tests start (``serving.py``, failing the test at
the server's end): no code path of ours may open a connection on its own, and the media fetcher
is only ever pointed at the tests' loopback hosts.

An audit hook (PEP 578) sees the connections of every Python socket, whatever library opened
it, and cannot be removed once added."""

from __future__ import annotations

import ipaddress
import socket
import sys
from typing import Any

#: What a refusal writes on stderr: a server's tests look for it in its log.
REFUSED = "no-network guard: refused"
#: The refusals of this process, in order.
refused: list[str] = []
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def install() -> None:
    """Adds the audit hook to this process (once)."""
    if not getattr(sys, "_llamactx_no_network", False):
        sys.addaudithook(_audit)
        sys._llamactx_no_network = True  # type: ignore[attr-defined]


def _audit(event: str, arguments: tuple[Any, ...]) -> None:
    if event == "socket.connect":
        sock, address = arguments
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            _refuse(f"a connection to {address!r}")
    elif event == "socket.getaddrinfo":
        host = arguments[0]
        if host is not None and not _is_loopback(host.decode() if isinstance(host, bytes) else str(host)):
            _refuse(f"resolving {host!r}")


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _refuse(what: str) -> None:
    message = f"{REFUSED} {what}"
    refused.append(message)
    print(message, file=sys.stderr, flush=True)
    raise PermissionError(message)
