"""The operator's own HTTP/1.1 exchange, against a scripted server on a real socket: each framing of an
answer read whole, connections kept alive and reused, one the server closed noticed, a broken write never
sent twice. (Every cluster test speaks to the real API server through it too, over TLS.)"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from kubetrain_operator.runtime import connections, kube

pytestmark = pytest.mark.unit


@dataclass
class Scripted:
    """A server that answers each request with the next scripted bytes; after an answer marked `close`
    it closes that connection. Records each request's head and body, and which connection carried it."""

    answers: list[tuple[bytes, bool]]
    requests: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    accepted: int = 0

    def serve(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._connection, args=(sock, self.accepted), daemon=True).start()

    def _connection(self, sock: socket.socket, number: int) -> None:
        data = b""
        with sock:
            while self.answers:
                while b"\r\n\r\n" not in data:
                    received = sock.recv(65536)
                    if not received:
                        return
                    data += received
                head, _, data = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                while len(data) < length:
                    data += sock.recv(65536)
                body, data = data[:length], data[length:]
                self.requests.append((number, head, body))
                answer, close = self.answers.pop(0)
                sock.sendall(answer)
                if close:
                    return


@pytest.fixture
def server() -> Iterator[tuple[Scripted, connections.Connections]]:
    listener = socket.create_server(("127.0.0.1", 0))
    scripted = Scripted([])
    threading.Thread(target=scripted.serve, args=(listener,), daemon=True).start()
    pool = connections.Connections(f"http://127.0.0.1:{listener.getsockname()[1]}", None, None, 4)
    try:
        yield scripted, pool
    finally:
        pool.close()
        listener.close()


def _get(pool: connections.Connections, path: str = "/api/v1/x") -> connections.Answer:
    return pool.exchange("GET", pool.origin + path, {"Accept": "application/json"}, None, timeout=5)


OK = b'{"kind":"Status"}'
KEPT_EMPTY = (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", False)
"""An answer of `{}`, the connection kept open."""
CLOSED_UNANSWERED = (b"", True)
"""The request read, then its connection closed with no answer."""
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;ext=1\r\n" + OK[:5] + b"\r\nC\r\n" + OK[5:] + b"\r\n0\r\nX-Trailer: 1\r\n\r\n"
)


@pytest.mark.parametrize(
    ("answer", "status", "data"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n" + OK, 200, OK),
        (CHUNKED, 200, OK),
        (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b""),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 17\r\n\r\n" + OK, 201, OK),
        (b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}", 404, b"{}"),
    ],
    ids=["content length", "chunked with extensions and trailers", "no body", "after a 1xx", "an error"],
)
def test_each_framing_of_an_answer_is_read_whole_and_the_connection_kept(
    server: tuple[Scripted, connections.Connections], answer: bytes, status: int, data: bytes
) -> None:
    scripted, pool = server
    scripted.answers = [(answer, False), KEPT_EMPTY]
    first = _get(pool)
    assert (first.status, first.data) == (status, data)
    assert _get(pool).data == b"{}"
    assert [number for number, _, _ in scripted.requests] == [1, 1]  # one connection, kept alive


def test_a_body_that_runs_to_the_connections_end_is_read_and_that_connection_not_reused(
    server: tuple[Scripted, connections.Connections],
) -> None:
    scripted, pool = server
    scripted.answers = [
        (b"HTTP/1.0 200 OK\r\n\r\n" + OK, True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", False),
    ]
    assert _get(pool).data == OK
    assert _get(pool).status == 200
    assert [number for number, _, _ in scripted.requests] == [1, 2]


def test_a_request_goes_out_with_its_host_headers_and_body_in_one_piece(
    server: tuple[Scripted, connections.Connections],
) -> None:
    scripted, pool = server
    scripted.answers = [(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}", False)]
    url = pool.origin + "/api/v1/namespaces/ns/services?fieldManager=kubetrain"
    answer = pool.exchange("POST", url, {"Content-Type": "application/json"}, b'{"a":1}', timeout=5)
    assert answer.status == 201
    _, head, body = scripted.requests[0]
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /api/v1/namespaces/ns/services?fieldManager=kubetrain HTTP/1.1"
    assert b"Host: " + pool.origin.split("//")[1].encode() in lines
    assert b"Content-Type: application/json" in lines and b"Content-Length: 7" in lines
    assert body == b'{"a":1}'


def test_a_connection_the_server_closed_while_idle_is_not_reused(
    server: tuple[Scripted, connections.Connections],
) -> None:
    scripted, pool = server
    scripted.answers = [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", True),  # the server closes after answering
        KEPT_EMPTY,
    ]
    assert _get(pool).status == 200
    threading.Event().wait(0.2)  # the close reaches this side
    answer = pool.exchange("POST", pool.origin + "/x", {}, b"{}", timeout=5)
    assert answer.status == 200  # a write too: the closed connection was noticed before sending
    assert [number for number, _, _ in scripted.requests] == [1, 2]


def test_a_write_whose_connection_broke_before_its_answer_raises_and_is_not_sent_again(
    server: tuple[Scripted, connections.Connections],
) -> None:
    scripted, pool = server
    scripted.answers = [KEPT_EMPTY, CLOSED_UNANSWERED, KEPT_EMPTY]
    assert _get(pool).status == 200
    with pytest.raises(OSError):
        pool.exchange("POST", pool.origin + "/x", {}, b"{}", timeout=5)
    assert len(scripted.requests) == 2
    assert _get(pool).status == 200  # on a new connection
    assert [number for number, _, _ in scripted.requests] == [1, 1, 2]


def test_a_get_whose_kept_connection_broke_before_its_answer_is_asked_again_on_a_new_one(
    server: tuple[Scripted, connections.Connections],
) -> None:
    scripted, pool = server
    scripted.answers = [
        KEPT_EMPTY,
        CLOSED_UNANSWERED,
        (b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n" + OK, False),
    ]
    assert _get(pool).status == 200
    assert _get(pool).data == OK
    assert [number for number, _, _ in scripted.requests] == [1, 1, 2]


def test_a_header_holding_a_line_break_is_refused_before_anything_is_sent(
    server: tuple[Scripted, connections.Connections],
) -> None:
    scripted, pool = server
    with pytest.raises(ValueError, match="line break"):
        pool.exchange("GET", pool.origin + "/x", {"User-Agent": "a\r\nX-Injected: 1"}, None, timeout=5)
    assert scripted.requests == []


def test_an_answer_that_is_not_http_is_an_api_error_of_status_0(
    server: tuple[Scripted, connections.Connections],
) -> None:
    scripted, pool = server
    scripted.answers = [(b"SSH-2.0-OpenSSH\r\n\r\n", True)]
    client = kube.Kube(_ClientOf(pool.origin))
    with pytest.raises(kube.ApiError) as refused:
        client.request("GET", "/api/v1/x")
    assert refused.value.status == 0 and "not an HTTP/1.x status line" in refused.value.message


class _ClientOf:
    """The parts of kubernetes.client.ApiClient that `kube.Kube` and `connections.for_client` use, for
    plain HTTP to `origin`."""

    def __init__(self, origin: str) -> None:
        self.configuration = type(
            "Configuration",
            (),
            {
                "host": origin,
                "proxy": None,
                "socket_options": None,
                "assert_hostname": None,
                "tls_server_name": None,
                "connection_pool_maxsize": 2,
            },
        )()

    def param_serialize(self, *, method: str, resource_path: str, query_params: object, **_: object) -> tuple:
        return method, self.configuration.host + resource_path, {"Accept": "application/json"}, None, None


@pytest.mark.parametrize(
    ("setting", "value"),
    [("proxy", "http://proxy:3128"), ("socket_options", []), ("assert_hostname", "other.name")],
)
def test_a_configuration_this_exchange_does_not_speak_keeps_urllib3(setting: str, value: object) -> None:
    client = _ClientOf("http://127.0.0.1:6443")
    assert connections.for_client(client) is not None
    setattr(client.configuration, setting, value)
    assert connections.for_client(client) is None


@contextlib.contextmanager
def _one_connection_server(
    serve: Callable[[socket.socket, threading.Event], None],
) -> Iterator[connections.Connections]:
    """A pool on a server whose one connection reads the request, then runs `serve(sock, stop)` (`stop`
    is set as the test ends): for answers `Scripted` does not give, such as a trickle or a reset."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept_and_serve() -> None:
        sock, _ = listener.accept()
        with sock:
            sock.recv(65536)
            serve(sock, stop)

    threading.Thread(target=accept_and_serve, daemon=True).start()
    pool = connections.Connections(f"http://127.0.0.1:{listener.getsockname()[1]}", None, None, 1)
    try:
        yield pool
    finally:
        stop.set()
        pool.close()
        listener.close()


def _get_within(pool: connections.Connections, timeout: float) -> connections.Answer:
    return pool.exchange("GET", pool.origin + "/x", {}, None, timeout=timeout)


def test_a_request_has_its_time_in_all_not_per_socket_operation() -> None:
    """An answer trickling in (a byte every 0.1 s, 100 bytes) would renew a per-operation limit of 0.5 s
    forever; the request's limit is a total, so it ends with TimeoutError."""

    def trickle(sock: socket.socket, stop: threading.Event) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(100):
            if stop.wait(0.1):
                return
            sock.sendall(b"x")

    with _one_connection_server(trickle) as pool, pytest.raises(TimeoutError):
        _get_within(pool, 0.5)


def test_a_body_that_runs_to_the_connections_end_is_refused_when_the_connection_is_reset() -> None:
    """An answer without length or chunks ends with the connection; a reset (RST) is not that end, so
    the part received is not taken for the whole."""

    def reset_midway(sock: socket.socket, stop: threading.Event) -> None:
        sock.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + OK[:5])
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stop.wait(0.2)  # the partial body reaches the client before the reset

    with _one_connection_server(reset_midway) as pool, pytest.raises(ConnectionResetError):
        _get_within(pool, 5)
