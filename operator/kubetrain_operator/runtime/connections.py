"""Keep-alive HTTP/1.1 connections to the API server, and one request and its answer on them.

Why not urllib3 for these: one short request through urllib3 and http.client costs about 480 us of the
operator's CPU (a quarter of it http.client parsing the answer's headers through the email package, a
fifth urllib3 wrapping the answer), and the operator makes about eight per TrainingJob: 22% of its CPU
samples at N = 500 (benchmarks/results/operator-profile-n500.md, fourth profile). Here a request is one
`sendall` of bytes formatted at once and its answer is cut from the received bytes with bytes operations:
the status line, the headers that frame the body, the body by Content-Length or chunked framing.

What is kept from the official client: its TLS settings (CA, client certificate, hostname check, SNI
name) and, per request, the URL and headers it serializes (which refresh an expiring token). Where its
configuration asks for something this module does not do (a proxy, socket options, a certificate name
other than the host's), `for_client` returns None and the operator keeps urllib3. Watches stream through
urllib3 and `watchstream`, one request per five minutes per informer.

Every answer is read to its end, so a connection goes back to the pool with nothing pending on it; one
the server closed while idle is noticed before reuse (it reads as ready: its end of file), and a GET
that finds it broken anyway is sent once more on a new connection. A write that failed is never resent
here: the caller's error handling (level-based reconciles) decides.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

RECEIVE_SIZE = 1 << 16
"""Most bytes taken from the connection at once."""

MAX_HEAD = 1 << 16
"""Longest status line and headers accepted; anything longer is not the API server's answer."""

NO_BODY_STATUSES = frozenset({204, 304})


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    data: bytes


class _ClosedError(ConnectionResetError):
    """The server closed the connection cleanly (end of file), as opposed to a reset."""


class _Connection:
    """One socket, with what the current request has received on it and the time it has left."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.received = 0
        """Bytes received for the current answer: none means the server never began one."""
        self.deadline = 0.0
        """time.monotonic() by which the current request must be answered."""

    def wait_at_most_until_deadline(self) -> None:
        """The socket's timeout set to what is left of the request's time: the request's limit is a
        total, as urllib3's, not a limit per socket operation that a trickling answer could renew."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the API server did not answer in time")
        self.sock.settimeout(left)

    def receive(self) -> bytes:
        self.wait_at_most_until_deadline()
        data = self.sock.recv(RECEIVE_SIZE)
        if not data:
            raise _ClosedError("the API server closed the connection")
        self.received += len(data)
        return data

    def stale(self) -> bool:
        """Whether an idle connection was closed by the server (or has bytes nobody asked for)."""
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Connections:
    """A pool of keep-alive connections to one API server; thread-safe, one request per connection at a
    time."""

    def __init__(
        self, origin: str, context: ssl.SSLContext | None, server_hostname: str | None, maxsize: int
    ) -> None:
        """`origin` is scheme://host:port; `context` None speaks plain HTTP."""
        parts = urlsplit(origin)
        if parts.hostname is None:
            raise ValueError(f"no host in the API server's address {origin!r}")
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self._netloc = parts.netloc
        self._address = (parts.hostname, parts.port or (443 if context is not None else 80))
        self._context = context
        self._server_hostname = server_hostname or parts.hostname
        self._maxsize = maxsize
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()

    def exchange(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes | None,
        *,
        timeout: float,
        before_send: Callable[[], None] | None = None,
    ) -> Answer:
        """Send one request for `url` (under this pool's origin) and read its whole answer, all within
        `timeout` seconds (a new connection's set-up included). `before_send` runs right before the bytes
        go out and may raise to stop the request. Raises OSError (TimeoutError when the time is up) or
        ValueError when the connection or the answer breaks."""
        if not url.startswith(self.origin):
            raise ValueError(f"{url!r} is not under {self.origin!r}")
        request = _request_bytes(method, url[len(self.origin) :] or "/", self._netloc, headers, body)
        deadline = time.monotonic() + timeout
        for attempt in (0, 1):
            connection, reused = self._take(deadline)
            connection.received = 0
            connection.deadline = deadline
            try:
                connection.wait_at_most_until_deadline()
                if before_send is not None:
                    before_send()
            except BaseException:
                self._give_back(connection)
                raise
            try:
                connection.sock.sendall(request)
                answer, keep = _read_answer(connection, method)
            except (OSError, ValueError):
                connection.close()
                if attempt == 0 and reused and method == "GET" and not connection.received:
                    continue  # closed by the server as it went idle: ask again on a new connection
                raise
            if keep:
                self._give_back(connection)
            else:
                connection.close()
            return answer
        raise AssertionError("unreachable: the second attempt returns or raises")

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _take(self, deadline: float) -> tuple[_Connection, bool]:
        """An idle connection that is still open, else a new one made by `deadline`; and whether it was
        reused."""
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                return self._connect(deadline), False
            if not connection.stale():
                return connection, True
            connection.close()

    def _give_back(self, connection: _Connection) -> None:
        with self._lock:
            if len(self._idle) < self._maxsize:
                self._idle.append(connection)
                return
        connection.close()

    def _connect(self, deadline: float) -> _Connection:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no time left to connect to the API server")
        sock = socket.create_connection(self._address, timeout=left)  # the TLS handshake within it too
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self._server_hostname)
        except BaseException:
            sock.close()
            raise
        return _Connection(sock)


def _request_bytes(method: str, target: str, host: str, headers: dict[str, str], body: bytes | None) -> bytes:
    if any("\r" in text or "\n" in text for text in (target, *headers, *headers.values())):
        raise ValueError("a request header or target holds a line break")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return data + body if body else data


def _read_answer(connection: _Connection, method: str) -> tuple[Answer, bool]:
    """The answer's status, reason and whole body, and whether the connection may carry another
    request."""
    buffer = b""
    while True:  # informational (1xx) heads are skipped: the final answer follows them
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > MAX_HEAD:
                raise ValueError("the answer's head is too long")
            buffer += connection.receive()
        lines = buffer[:end].split(b"\r\n")
        buffer = buffer[end + 4 :]
        version, _, rest = lines[0].partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(code)
        if status >= 200:
            break
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            raise ValueError(f"a header line without a colon: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    keep = version == b"HTTP/1.1" and headers.get(b"connection", b"").lower() != b"close"
    if status in NO_BODY_STATUSES or method == "HEAD":
        body = b""
    elif b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        body, buffer = _dechunked(connection, buffer)
    elif (length := headers.get(b"content-length")) is not None:
        size = int(length)
        while len(buffer) < size:
            buffer += connection.receive()
        body, buffer = buffer[:size], buffer[size:]
    else:  # the body runs to the end of the connection
        pieces = [buffer]
        try:
            while True:
                pieces.append(connection.receive())
        except _ClosedError:  # the body's end; a reset is not, and raises
            pass
        body, buffer, keep = b"".join(pieces), b"", False
    if buffer:  # bytes after the answer: nothing was asked for them
        keep = False
    return Answer(status, reason.decode("latin-1"), body), keep


def _dechunked(connection: _Connection, data: bytes) -> tuple[bytes, bytes]:
    """A chunked body (RFC 9112, section 7.1) read whole, starting with `data` already received; returns
    it and the bytes after its end (trailers skipped)."""
    pieces: list[bytes] = []
    pos = 0
    while True:
        while (eol := data.find(b"\r\n", pos)) < 0:
            if len(data) - pos > MAX_HEAD:
                raise ValueError("a chunk-size line is too long")
            data += connection.receive()
        size = int(data[pos:eol].split(b";", 1)[0], 16)
        pos = eol + 2
        if size == 0:
            while True:  # trailer lines up to an empty one
                while (eol := data.find(b"\r\n", pos)) < 0:
                    if len(data) - pos > MAX_HEAD:
                        raise ValueError("a trailer line is too long")
                    data += connection.receive()
                line, pos = data[pos:eol], eol + 2
                if not line:
                    return b"".join(pieces), data[pos:]
        while len(data) < pos + size + 2:
            data += connection.receive()
        if data[pos + size : pos + size + 2] != b"\r\n":
            raise ValueError("a chunk's data is not followed by CRLF")
        pieces.append(data[pos : pos + size])
        pos += size + 2
        if pos > RECEIVE_SIZE:  # drop what was consumed, so appending stays cheap
            data, pos = data[pos:], 0


def for_client(api_client: Any) -> Connections | None:
    """Connections with the TLS settings of a kubernetes.client.ApiClient's configuration, or None where
    that configuration needs urllib3 (a proxy, socket options, a certificate name other than the host's,
    an address that is not http(s)), or where `api_client` has no configuration."""
    configuration = getattr(api_client, "configuration", None)
    if configuration is None:
        return None
    origin = str(configuration.host)
    scheme = urlsplit(origin).scheme
    if (
        scheme not in ("http", "https")
        or getattr(configuration, "proxy", None)
        or getattr(configuration, "socket_options", None) is not None
        or isinstance(getattr(configuration, "assert_hostname", None), str)
    ):
        return None
    context = _tls_context(configuration) if scheme == "https" else None
    maxsize = configuration.connection_pool_maxsize or 1
    return Connections(origin, context, getattr(configuration, "tls_server_name", None), maxsize)


def _tls_context(configuration: Any) -> ssl.SSLContext:
    """What the official client asks urllib3 for: the CA (file or data) or the system's, the hostname
    checked unless `assert_hostname` is False, no verification at all without `verify_ssl`, and the
    client certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if configuration.verify_ssl:
        ca_file = configuration.ssl_ca_cert
        ca_data = getattr(configuration, "ca_cert_data", None)
        if ca_file or ca_data:
            context.load_verify_locations(cafile=ca_file, cadata=ca_data)
        else:
            context.load_default_certs()
        context.check_hostname = configuration.assert_hostname is not False
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context
