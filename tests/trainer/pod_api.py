"""A stand-in for the API server's pod PATCH endpoint on 127.0.0.1, for the trainer's `PodAnnotator`.

It records every request (path, headers, JSON body) and answers `status`; the progress and heartbeat tests
read what the trainer sent from it.
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from testcluster.pki import ServingPair


class PodApi:
    """The recording server's state: what it received, and the status it answers with (200 by default)."""

    def __init__(self) -> None:
        self.url = ""
        self.status = 200
        self._requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request so far, oldest first: `{"path", "headers", "body"}`."""
        with self._lock:
            return list(self._requests)

    def annotations(self, key: str) -> list[dict[str, Any]]:
        """The decoded values of annotation `key` in the patches received, oldest first."""
        values = [r["body"]["metadata"]["annotations"].get(key) for r in self.requests]
        return [json.loads(value) for value in values if value is not None]

    def receive(self, request: dict[str, Any]) -> int:
        """Record `request`; the status to answer it with."""
        with self._lock:
            self._requests.append(request)
            return self.status


@contextmanager
def serving(tls: ServingPair | None = None) -> Iterator[PodApi]:
    """A running `PodApi` at `api.url`, plain HTTP or HTTPS with `tls`'s certificate; shut down on exit."""
    api = PodApi()

    class Handler(BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = api.receive({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert, tls.key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
