"""Watch lines cut from the chunked body as it arrives: the same lines wherever the network splits it,
a broken body refused, and urllib3's real answer read this way over a real socket."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator

import pytest
import urllib3
from kubetrain_operator.runtime import watchstream

pytestmark = pytest.mark.unit

EVENTS = [b'{"type":"ADDED","object":{"n":1}}', b'{"type":"MODIFIED","object":{"n":"' + b"x" * 300 + b'"}}']


def chunked(pieces: list[bytes], trailer: bytes = b"") -> bytes:
    """`pieces` framed as chunks (sizes in lower and upper case hex), the last chunk and its trailer."""
    out = b""
    for i, piece in enumerate(pieces):
        size = format(len(piece), "x" if i % 2 else "X").encode()
        out += size + (b";ext=1" if i == 1 else b"") + b"\r\n" + piece + b"\r\n"
    return out + b"0\r\n" + trailer + b"\r\n"


def reader(body: bytes, step: int) -> Callable[[], bytes]:
    """What a connection hands over `step` bytes at a time, then b"" (closed)."""
    parts: Iterator[bytes] = iter([body[i : i + step] for i in range(0, len(body), step)])
    return lambda: next(parts, b"")


# One event per chunk (the API server's way), an event split across two chunks, two events in one chunk.
BODIES = {
    "one event per chunk": chunked([e + b"\n" for e in EVENTS]),
    "an event across chunks": chunked([EVENTS[0][:7], EVENTS[0][7:] + b"\n", EVENTS[1] + b"\n"]),
    "two events in a chunk": chunked([EVENTS[0] + b"\n" + EVENTS[1] + b"\n"], trailer=b"X-T: 1\r\n"),
}


@pytest.mark.parametrize("body", list(BODIES.values()), ids=list(BODIES))
def test_the_lines_are_the_same_wherever_the_network_splits_the_body(body: bytes) -> None:
    for step in range(1, len(body) + 1):
        assert list(watchstream.dechunked_lines(reader(body, step))) == EVENTS, step


def test_a_last_line_without_its_newline_is_still_a_line() -> None:
    body = chunked([EVENTS[0] + b"\n" + EVENTS[1]])
    assert list(watchstream.dechunked_lines(reader(body, 5))) == EVENTS


@pytest.mark.parametrize(
    "body",
    [
        chunked([EVENTS[0] + b"\n"])[:-5],  # the connection closed before the last chunk
        b"zz\r\n" + EVENTS[0] + b"\r\n0\r\n\r\n",  # a size that is not hex
        b"3\r\nabcd\r\n0\r\n\r\n",  # data longer than its size: no CRLF where it must be
        b"1" * (watchstream.MAX_SIZE_LINE + 10),  # no size line ever ends
    ],
    ids=["ends early", "bad size", "no CRLF after the data", "endless size line"],
)
def test_a_broken_body_is_refused(body: bytes) -> None:
    with pytest.raises(urllib3.exceptions.ProtocolError):
        list(watchstream.dechunked_lines(reader(body, 7)))


class _Chunked(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in EVENTS:  # flushed one by one, as the API server does
            self.wfile.write(chunked([event + b"\n"])[: -len(b"0\r\n\r\n")])
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


def test_urllib3s_streamed_answer_is_read_from_its_connection_and_closed_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Chunked)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cut: list[bool] = []
    dechunk = watchstream.dechunked_lines
    monkeypatch.setattr(watchstream, "dechunked_lines", lambda read: (cut.append(True), dechunk(read))[1])
    try:
        with urllib3.PoolManager() as pool:
            url = f"http://127.0.0.1:{server.server_port}/watch"
            response = pool.request("GET", url, preload_content=False)
            assert list(watchstream.lines(response)) == EVENTS
            assert cut == [True]  # read past urllib3's iteration, not through it
            assert response.closed
            # The pool answers the next request on a fresh connection.
            assert pool.request("GET", url).data.count(b"\n") == len(EVENTS)
    finally:
        server.shutdown()
