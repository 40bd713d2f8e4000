"""The liveness endpoint a standby answers until kopf serves it: on kopf's address, on real sockets."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from kubetrain_operator.runtime import health
from testcluster import processes

pytestmark = pytest.mark.unit


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://0.0.0.0:8081/healthz", ("0.0.0.0", 8081, "/healthz")),
        ("http://127.0.0.1:9000/", ("127.0.0.1", 9000, "/")),
        ("http://:8081/healthz", ("localhost", 8081, "/healthz")),
        ("http://example:8081", ("example", 8081, "/")),
        ("http://example/healthz", ("example", 80, "/healthz")),
    ],
)
def test_the_endpoint_is_read_as_kopf_reads_it(endpoint: str, expected: tuple[str, int, str]) -> None:
    assert health.address(endpoint) == expected


def test_only_http_is_served() -> None:
    with pytest.raises(ValueError, match="only http://"):
        health.address("https://0.0.0.0:8081/healthz")


def test_answers_200_while_healthy_503_when_not_and_404_elsewhere() -> None:
    port = processes.free_port()
    healthy = [True]
    server = health.StandbyHealth(f"http://127.0.0.1:{port}/healthz", lambda: healthy[0])
    try:
        status, body = _get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200 and "campaigning" in body
        assert _get(f"http://127.0.0.1:{port}/healthz?verbose=1")[0] == 200
        healthy[0] = False
        status, body = _get(f"http://127.0.0.1:{port}/healthz")
        assert status == 503 and "stopped turning" in body
        assert _get(f"http://127.0.0.1:{port}/metrics")[0] == 404
    finally:
        server.close()


def test_closing_gives_the_address_up_for_kopf_and_closing_twice_is_harmless() -> None:
    port = processes.free_port()
    server = health.StandbyHealth(f"http://127.0.0.1:{port}/healthz", lambda: True)
    with pytest.raises(OSError):  # the address is taken while it answers
        health.StandbyHealth(f"http://127.0.0.1:{port}/healthz", lambda: True)
    server.close()
    server.close()
    with pytest.raises(urllib.error.URLError):
        _get(f"http://127.0.0.1:{port}/healthz")
    with socket.create_server(("127.0.0.1", port)):  # as kopf's server binds it next
        pass
