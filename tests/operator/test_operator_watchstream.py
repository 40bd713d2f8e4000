"""Watch lines cut from the chunked body as it arrives: the same lines wherever the network splits it,
a broken body refused, and urllib3's real answer read this way over a real socket."""

from __future__ import annotations

import http.server
import json
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


def _event_line(obj: dict[str, object]) -> bytes:
    """A watch event as the API server writes it: compact JSON, members in the order given."""
    return json.dumps({"type": "MODIFIED", "object": obj}, separators=(",", ":")).encode()


def _entry(manager: str, fields: dict[str, object]) -> dict[str, object]:
    return {
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-12-06T13:41:46Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }


def _pod(managed: list[dict[str, object]]) -> dict[str, object]:
    """A Pod in the built-in types' member order: metadata first, managedFields last in it."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "w-0",
            "namespace": "ns",
            "labels": {"kubetrain.io/job-name": "w"},
            "annotations": {"note": 'a "quoted" ] and a \\ backslash'},
            "finalizers": ["batch.kubernetes.io/job-tracking"],
            "managedFields": managed,
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "args": ["]", '"']}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _custom_resource(managed: list[dict[str, object]]) -> dict[str, object]:
    """A custom resource in the sorted member order of its JSON: managedFields amid metadata."""
    return {
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {
            "creationTimestamp": "2026-12-06T13:41:46Z",
            "generation": 1,
            "labels": {"a": "b"},
            "managedFields": managed,
            "name": "w",
            "namespace": "ns",
            "resourceVersion": "42",
        },
        "spec": {"workers": 4, "managedFields": ["a user's key of that name, in spec"]},
        "status": {"phase": "Running"},
    }


ORDINARY = [
    _entry("kube-controller-manager", {"f:metadata": {"f:labels": {".": {}, "f:a": {}}}}),
    _entry("kubelet", {"f:status": {"f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:status": {}}}}}),
]
BRACKET_IN_A_KEY = [_entry("kubetrain", {"f:spec": {"f:env": {'k:{"name":"A]B"}': {}}}})]
QUOTE_AND_BRACKET_IN_A_KEY = [_entry("kubetrain", {"f:spec": {"f:env": {'k:{"name":"A\\"]"}': {}}}})]
MANAGER_ENDING_LIKE_THE_LIST = [_entry("x}],", {"f:metadata": {}})]
"""A field manager's name is the client's to choose: `"manager":"x}],","operation"` puts `],"` and a
comma after a bracket inside a string."""
KEY_ENDING_LIKE_METADATA = [_entry("kubetrain", {"f:spec": {"f:trainer": {"f:a]},": {}}}})]
"""A custom resource's free-form map key (`"f:a]},":{}`): `},"` and a colon after the bracket."""
MANY_BRACKETS_IN_KEYS = [
    _entry("kubetrain", {f"f:k{i}]": {} for i in range(watchstream.MAX_CLOSE_TRIES + 1)})
]


@pytest.mark.parametrize(
    ("obj", "cut"),
    [
        (_pod(ORDINARY), True),
        (_custom_resource(ORDINARY), True),
        (_pod([]), True),
        (_pod(BRACKET_IN_A_KEY), True),
        (_custom_resource(BRACKET_IN_A_KEY), True),
        (_pod(QUOTE_AND_BRACKET_IN_A_KEY), True),
        (_pod(MANAGER_ENDING_LIKE_THE_LIST), True),
        (_custom_resource(MANAGER_ENDING_LIKE_THE_LIST), True),
        (_custom_resource(KEY_ENDING_LIKE_METADATA), True),
        (_pod(MANY_BRACKETS_IN_KEYS), False),
    ],
    ids=[
        "pod",
        "custom resource",
        "empty list",
        "a bracket in a field key",
        "a bracket in a custom resource's field key",
        "an escaped quote before a bracket",
        "a manager's name ending like the list",
        "a custom resource's manager's name ending like the list",
        "a custom resource's map key ending like metadata",
        "more brackets in strings than tried: left whole",
    ],
)
def test_managed_fields_are_cut_from_an_event_line_exactly_or_the_line_is_left_whole(
    obj: dict[str, object], cut: bool
) -> None:
    line = _event_line(obj)
    expected = json.loads(line)
    del expected["object"]["metadata"]["managedFields"]
    out = watchstream.without_managed_fields(line)
    if cut:
        assert json.loads(out) == expected
        assert len(out) < len(line)
    else:
        assert out is line


def test_a_line_without_managed_fields_is_left_as_it_is() -> None:
    bookmark = (
        b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}'
    )
    assert watchstream.without_managed_fields(bookmark) is bookmark
