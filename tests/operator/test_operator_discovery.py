"""API discovery at start-up (`runtime.main.discover`): a passing failure is never taken for "not served"."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubetrain_operator.runtime import kube, main

pytestmark = pytest.mark.unit


def _asker(*outcomes: Exception | frozenset[str]) -> tuple[list[int], Callable[[], frozenset[str]]]:
    calls: list[int] = []

    def ask() -> frozenset[str]:
        outcome = outcomes[len(calls)]
        calls.append(1)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return calls, ask


def test_a_passing_failure_is_asked_again_until_the_api_server_answers() -> None:
    calls, ask = _asker(
        kube.ApiError(0, "ConnectionError", "connection refused"),
        kube.ApiError(503, "ServiceUnavailable", "etcd leader changed"),
        kube.ApiError(429, "TooManyRequests", "slow down"),
        frozenset({"podgroups", "workloads"}),
    )
    slept: list[float] = []
    assert main.discover(ask, "scheduling.k8s.io/v1beta1", slept.append) == {"podgroups", "workloads"}
    assert len(calls) == 4 and slept == [1.0, 2.0, 4.0]


def test_a_refusal_is_raised_at_once_not_asked_again() -> None:
    calls, ask = _asker(kube.ApiError(403, "Forbidden", "no discovery for you"))
    slept: list[float] = []
    with pytest.raises(kube.ApiError) as refused:
        main.discover(ask, "kueue.x-k8s.io/v1beta2", slept.append)
    assert refused.value.status == 403 and len(calls) == 1 and slept == []


def test_the_waits_grow_to_fifteen_seconds_and_stay_there() -> None:
    down = kube.ApiError(0, "ConnectionError", "no route to host")
    _, ask = _asker(*[down] * 7, frozenset())
    slept: list[float] = []
    assert main.discover(ask, "kueue.x-k8s.io/v1beta2", slept.append) == frozenset()
    assert slept == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
