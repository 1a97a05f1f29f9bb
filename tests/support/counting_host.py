"""A loopback HTTP host that answers every GET with a JSON Schema and counts the requests: what a
schema's reference would fetch, if anything fetched it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: What the host serves: a schema no JSON value but a string satisfies.
SERVED = json.dumps({"type": "string"}).encode()


@dataclass
class CountingHost:
    url: str
    paths: list[str] = field(default_factory=list)


@contextmanager
def counting_host() -> Iterator[CountingHost]:
    """A host on 127.0.0.1 and a port the system picks, until the block ends."""
    host = CountingHost("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            host.paths.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/schema+json")
            self.send_header("Content-Length", str(len(SERVED)))
            self.end_headers()
            self.wfile.write(SERVED)

        def log_message(self, format: str, *args: object) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    host.url = f"http://127.0.0.1:{http.server_port}"
    serving = threading.Thread(target=http.serve_forever, daemon=True)
    serving.start()
    try:
        yield host
    finally:
        http.shutdown()
        http.server_close()
        serving.join(5)
