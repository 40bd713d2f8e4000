"""API discovery at start-up (`runtime.main.discover`): a passing failure is never taken for "not served"."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from kubetrain_operator.api import constants
from kubetrain_operator.planning import plans
from kubetrain_operator.runtime import discovery, kube, main

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


class _Cluster:
    """What a cluster serves, changed by the test as an admin would install things; every question
    asked is recorded, and `down` makes each answer a passing failure."""

    def __init__(self) -> None:
        self.apis: dict[str, frozenset[str]] = {}
        self.down = False
        self.asked: list[str] = []

    def _answer(self, api_version: str) -> None:
        self.asked.append(api_version)
        if self.down:
            raise kube.ApiError(503, "ServiceUnavailable", "etcd leader changed")

    def serves(self, api_version: str) -> bool:
        self._answer(api_version)
        return api_version in self.apis

    def served_resources(self, api_version: str) -> frozenset[str]:
        self._answer(api_version)
        if api_version not in self.apis:
            raise kube.ApiError(404, "NotFound", "the server could not find the requested resource")
        return self.apis[api_version]


def _late(
    cluster: _Cluster, defaults: plans.Defaults, *, kueue_wanted: bool = True
) -> tuple[discovery.LateAPIs, list[discovery.Found], dict[str, Any]]:
    current: dict[str, Any] = {"defaults": defaults}
    found: list[discovery.Found] = []

    def adopt(what: discovery.Found) -> None:
        found.append(what)
        current["defaults"] = dataclasses.replace(
            current["defaults"],
            kueue=current["defaults"].kueue or what.kueue,
            gang_provider=what.gang_provider or current["defaults"].gang_provider,
        )

    late = discovery.LateAPIs(
        cluster,  # type: ignore[arg-type]
        lambda: current["defaults"],
        adopt,
        kueue_wanted=kueue_wanted,
    )
    return late, found, current


def test_kueue_installed_after_the_start_is_found_at_the_next_round_and_then_no_longer_asked_for() -> None:
    cluster = _Cluster()
    late, found, current = _late(cluster, plans.Defaults(gang_provider="volcano"))
    assert late.check() == discovery.Found() and found == []
    cluster.apis[constants.KUEUE_API] = frozenset({"workloads"})
    assert late.check() == discovery.Found(kueue=True)
    assert current["defaults"].kueue and not late.missing()
    cluster.asked.clear()
    late.check()
    assert cluster.asked == [], "nothing is missing any more: no request"


def test_a_gang_api_installed_after_the_start_becomes_the_provider_of_new_jobs() -> None:
    cluster = _Cluster()
    late, _found, current = _late(cluster, plans.Defaults(kueue=True))
    assert late.check().gang_provider is None
    cluster.apis[constants.VOLCANO_PODGROUP_API] = frozenset({"podgroups"})
    assert late.check() == discovery.Found(gang_provider="volcano")
    assert current["defaults"].gang_provider == "volcano"


def test_a_failed_round_is_not_taken_for_not_served_and_is_asked_again() -> None:
    cluster = _Cluster()
    cluster.apis[constants.KUEUE_API] = frozenset({"workloads"})
    cluster.down = True
    late, _found, _current = _late(cluster, plans.Defaults(gang_provider="volcano"))
    assert late.check() == discovery.Found() and late.missing()
    cluster.down = False
    assert late.check() == discovery.Found(kueue=True)


def test_under_no_kueue_kueue_is_never_asked_for() -> None:
    cluster = _Cluster()
    late, _, _ = _late(cluster, plans.Defaults(gang_provider="volcano"), kueue_wanted=False)
    assert not late.missing()
    late.check()
    assert cluster.asked == []


def test_kueue_found_is_handed_over_once_even_before_its_informers_have_listed() -> None:
    """The shell sets Defaults.kueue only once Kueue's informers have listed; a round in between must not
    find Kueue again and start a second set of informers."""
    cluster = _Cluster()
    cluster.apis[constants.KUEUE_API] = frozenset({"workloads"})
    found: list[discovery.Found] = []
    late = discovery.LateAPIs(
        cluster,  # type: ignore[arg-type]
        lambda: plans.Defaults(gang_provider="volcano"),  # kueue stays False: the informers are still listing
        found.append,
        kueue_wanted=True,
    )
    late.check()
    late.check()
    assert found == [discovery.Found(kueue=True)]
    assert not late.missing()
