"""The liveness endpoint of a replica that kopf does not serve yet: a standby answers while it campaigns.

kopf serves `--liveness` once it runs, which with leader election is only after this replica leads. Until
then `StandbyHealth` answers on the same address, so the kubelet's probes see a standby as what it is:
alive and campaigning, ready to take over. That is what lets a rolling update finish: the Deployment stops
an old replica only once its replacement is Ready, and the replacement of the leader stands by until the
leader stops. 200 while `healthy()` (the election turns, `leader.LeaderElector.campaigning`), else 503.
The new leader closes it when kopf's startup is done, just before kopf serves the address itself.
"""

from __future__ import annotations

import http.server
import logging
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("kubetrain.operator")


def address(endpoint: str) -> tuple[str, int, str]:
    """The host, port and path of a liveness URL, read as kopf reads it (`http` only; no host: localhost,
    no port: 80), so that this server and kopf's take turns on the same address."""
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme != "http":
        raise ValueError(f"liveness endpoint {endpoint!r}: only http:// is served")
    return parts.hostname or "localhost", parts.port or 80, parts.path or "/"


class StandbyHealth:
    """An HTTP server in a daemon thread answering GET `path` with 200 while `healthy()`, else 503."""

    def __init__(self, endpoint: str, healthy: Callable[[], bool]) -> None:
        host, port, path = address(endpoint)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if urllib.parse.urlsplit(self.path).path != path:
                    self._answer(404, "not found")
                elif healthy():
                    self._answer(200, "standing by: campaigning for the Lease")
                else:
                    self._answer(503, "standing by, but the leader election stopped turning")

            def _answer(self, status: int, text: str) -> None:
                body = f"{text}\n".encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """The kubelet probes every few seconds: no line per request."""

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kubetrain-standby-health", daemon=True
        )
        self._thread.start()
        self._closed = threading.Lock()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def close(self) -> None:
        """Stop answering and free the address (for kopf's own server); once, from any thread but its own."""
        if not self._closed.acquire(blocking=False):
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
