"""The lines of a watch stream, read straight from the connection.

A watch answer is an HTTP/1.1 chunked body (RFC 9112, section 7.1) of JSON lines, and the API server
sends each event in a chunk of its own. urllib3's line iterator reads such a body one chunk at a time,
through about ten Python calls per chunk (a readline for the size, two reads, a decoder and a generator
per layer), and every change of every worker Job and Pod arrives this way: at 500 jobs of 4 workers
that iteration was 9% of the operator's CPU samples in a py-spy profile. Here the connection's buffered
reader hands over whatever has arrived (many chunks at once in a burst) and the framing is cut with
bytes operations.

Each event's `metadata.managedFields` is cut out of the line before it is parsed
(`without_managed_fields`): it is about 40% of a Pod or Job event's bytes, the operator reads none of it,
and parsing without it takes half the time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import urllib3

READ_SIZE = 1 << 16
"""Most bytes taken from the connection at once."""

MAX_SIZE_LINE = 1024
"""Longest chunk-size line accepted (hex digits and extensions); anything longer is not HTTP."""

MANAGED_FIELDS = b',"managedFields":['
MAX_CLOSE_TRIES = 8
"""Brackets tried for managedFields' end before the line is left whole (the first one, but for a bracket
inside a field's name)."""


def lines(response: urllib3.HTTPResponse) -> Iterator[bytes]:
    """The lines of a streamed answer, without their newlines, as they arrive. The answer is closed after:
    this reader, not http.client, consumed it, so its connection must not carry another request."""
    raw: Any = getattr(response, "_fp", None)  # the http.client response urllib3 wraps
    reader = getattr(raw, "fp", None)
    encoding = response.headers.get("Content-Encoding", "identity")
    if not response.chunked or reader is None or encoding != "identity":
        for line in response:  # not the API server's usual answer: urllib3's own iteration
            yield line.rstrip(b"\n")
        return
    try:
        yield from dechunked_lines(lambda: reader.read1(READ_SIZE))
    finally:
        response.close()


def dechunked_lines(read: Callable[[], bytes]) -> Iterator[bytes]:
    """The lines of a chunked body, without their newlines, from `read`,
    which returns the next bytes received, b"" when the connection closed. Trailers after the last chunk
    are not read. Raises urllib3's ProtocolError for a body that is not chunked framing or that ends
    early."""
    framed = b""  # received, framing not yet cut
    pending: list[bytes] = []  # the current line's pieces so far, when it spans chunks or reads
    data_left = 0  # bytes of the current chunk's data still to come
    crlf_due = False  # the CRLF after a chunk's data
    while True:
        received = read()
        if not received:
            raise urllib3.exceptions.ProtocolError("the watch stream ended inside its chunked body")
        framed = framed + received if framed else received
        pos = 0
        while True:
            if data_left:
                taken = framed[pos : pos + data_left]
                pos += len(taken)
                data_left -= len(taken)
                # Most chunks hold one whole line: it is yielded as it is, nothing joined or split.
                start = 0
                while (newline := taken.find(b"\n", start)) >= 0:
                    if pending:
                        pending.append(taken[start:newline])
                        yield b"".join(pending)
                        pending.clear()
                    else:
                        yield taken[start:newline]
                    start = newline + 1
                if start < len(taken):
                    pending.append(taken[start:])
                if data_left:
                    break
                crlf_due = True
            if crlf_due:
                if len(framed) - pos < 2:
                    break
                if framed[pos : pos + 2] != b"\r\n":
                    raise urllib3.exceptions.ProtocolError("a chunk's data is not followed by CRLF")
                pos += 2
                crlf_due = False
            end = framed.find(b"\r\n", pos)
            if end < 0:
                if len(framed) - pos > MAX_SIZE_LINE:
                    raise urllib3.exceptions.ProtocolError("a chunk-size line is too long")
                break
            try:
                size = int(framed[pos:end].split(b";", 1)[0], 16)
            except ValueError:
                raise urllib3.exceptions.ProtocolError(f"bad chunk size {framed[pos:end]!r}") from None
            pos = end + 2
            if size == 0:
                if pending:
                    yield b"".join(pending)
                return
            data_left = size
        framed = framed[pos:]


def without_managed_fields(line: bytes) -> bytes:
    """A watch event's line with its object's `metadata.managedFields` cut out, or `line` unchanged when
    the cut is not certain.

    Why the cut is exact, for the kinds the informers watch (Pods, Jobs, Services and custom resources):
    - The first `,"managedFields":[` is metadata's key. Inside a JSON string quotes are escaped, so those
      bytes are a key; metadata is the object's first member after apiVersion and kind (the built-in
      types' field order, and the sorted key order of custom resources), and the members before
      managedFields in it (names, labels, annotations, owner references, finalizers) have no such key.
    - The entries hold strings and objects only (fieldsV1 is a field set, objects all the way down), so
      a `]` in them is inside a string, and the list's own `]` is followed by the next member of
      metadata (`,"name"` in a custom resource) or by metadata's end and the next member of the object
      (`},"spec"`, `},"status"`): `,"` or `},"`, then a letter.
    - A `]` inside a string cannot be followed by that. The quote after its `,` is not escaped, so it
      would end the string, and what follows a string in the entries is `:`, `,` or `}`, not a letter.
    So the first `]` followed by `,"` or `},"` and a letter closes the list. Scanning twice for quotes
    instead would cost as much as parsing the bytes it saves.
    """
    start = line.find(MANAGED_FIELDS)
    if start < 0:
        return line
    close = start + len(MANAGED_FIELDS) - 1
    for _ in range(MAX_CLOSE_TRIES):
        close = line.find(b"]", close + 1)
        if close < 0:
            return line
        after = line[close + 1 : close + 5]
        if (after[:2] == b',"' and after[2:3].isalpha()) or (after[:3] == b'},"' and after[3:].isalpha()):
            return line[:start] + line[close + 1 :]
    return line
