"""A hostile RPC server on a free loopback port, for the red team and the fuzzer: it greets as
llama.cpp's server does (or with ``hello``), then answers every later request, answered or not,
with the next of ``answers``, and closes the connection when they run out."""

from __future__ import annotations

import socket
import threading

HELLO_COMMAND = 14  # ggml-rpc's RPC_CMD_HELLO
# An 8-byte size, then rpc_msg_hello_rsp: protocol 8.0.1 and no transport capabilities.
HELLO = (28).to_bytes(8, "little") + bytes([8, 0, 1, 0]) + bytes(24)
LARGEST_REQUEST = 1 << 26


def start(answers: list[bytes], *, hello: bytes = HELLO) -> str:
    """Serves until it has been idle for 5 s; returns its ``host:port``."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)
    pending = list(answers)

    def serve() -> None:
        with listener:
            while True:
                try:
                    connection, _ = listener.accept()
                except OSError:
                    return
                with connection:
                    connection.settimeout(5)
                    while (header := _read(connection, 9)) is not None:
                        size = int.from_bytes(header[1:], "little")
                        if size > LARGEST_REQUEST or _read(connection, size) is None:
                            break
                        answer = hello if header[0] == HELLO_COMMAND else (pending.pop(0) if pending else None)
                        if answer is None:
                            break
                        connection.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}"


def _read(connection: socket.socket, size: int) -> bytes | None:
    data = b""
    try:
        while len(data) < size:
            chunk = connection.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    return data
