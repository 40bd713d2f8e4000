"""The children's informers: list, then watch from the listing's version, list again when told."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from kubetrain_operator.runtime import informer, kube
from kubetrain_operator.runtime.cache import ClusterCache
from operator_fakes import NS, job

pytestmark = pytest.mark.unit


def _job(index: int, version: int) -> dict[str, Any]:
    out = job(index)
    out["metadata"]["resourceVersion"] = str(version)
    return out


class FakeWatchApi:
    """list_pages answers from `listing`; each watch() call plays the next script of events (or raises)."""

    def __init__(self, listing: list[dict[str, Any]], version: str, scripts: list[Any]) -> None:
        self.listing = listing
        self.version = version
        self.scripts = scripts
        self.lists = 0
        self.watched_from: list[str] = []

    def list_pages(
        self, kind: str, namespace: str | None, selector: str, limit: int = 500
    ) -> Iterator[tuple[list[Any], str]]:
        self.lists += 1
        yield copy.deepcopy(self.listing), self.version

    def watch(
        self, kind: str, namespace: str | None, selector: str, version: str
    ) -> Iterator[dict[str, Any]]:
        self.watched_from.append(version)
        script = self.scripts.pop(0)
        if isinstance(script, Exception):
            raise script
        yield from script


def _informer(
    api: FakeWatchApi, cache: ClusterCache, changed: list[Any], namespaces: list[str]
) -> informer.Informer:
    return informer.Informer(api, cache, "Job", informer.scopes(namespaces)[0], changed.append)  # type: ignore[arg-type]


def test_events_are_filed_and_wake_their_trainingjob() -> None:
    cache, changed = ClusterCache(), []
    jobs = _informer(FakeWatchApi([], "1", []), cache, changed, [NS])
    assert jobs.apply({"type": "ADDED", "object": _job(0, 5)}) == "5"
    assert jobs.apply({"type": "MODIFIED", "object": _job(0, 6)}) == "6"
    assert [j["metadata"]["resourceVersion"] for j in cache.children(NS, "demo", "Job")] == ["6"]
    assert jobs.apply({"type": "DELETED", "object": _job(0, 7)}) == "7"
    assert cache.children(NS, "demo", "Job") == []
    assert changed == [(NS, "demo")] * 3


def test_bookmarks_and_other_namespaces_only_advance_the_version() -> None:
    cache, changed = ClusterCache(), []
    jobs = _informer(FakeWatchApi([], "1", []), cache, changed, [NS])
    bookmark = {"type": "BOOKMARK", "object": {"kind": "Job", "metadata": {"resourceVersion": "9"}}}
    assert jobs.apply(bookmark) == "9"
    elsewhere = _job(0, 10)
    elsewhere["metadata"]["namespace"] = "team-b"
    assert jobs.apply({"type": "ADDED", "object": elsewhere}) == "10"
    assert changed == [] and cache.children("team-b", "demo", "Job") == []


def test_glob_patterns_watch_everything_and_keep_what_matches() -> None:
    [(namespace, in_scope)] = informer.scopes(["team-*"])
    assert namespace is None and in_scope("team-a") and not in_scope("kube-system")
    assert [ns for ns, _ in informer.scopes(["a", "b"])] == ["a", "b"]
    assert [ns for ns, _ in informer.scopes(None)] == [None]


def test_the_watch_continues_from_the_listing_and_from_each_event() -> None:
    api = FakeWatchApi([_job(0, 3)], "4", [[{"type": "ADDED", "object": _job(1, 8)}]])
    cache, changed = ClusterCache(), []
    jobs = _informer(api, cache, changed, [NS])
    version = jobs.relist()
    assert version == "4" and len(cache.children(NS, "demo", "Job")) == 1
    assert jobs.watch(version) == "8"
    assert api.watched_from == ["4"]
    assert len(cache.children(NS, "demo", "Job")) == 2


@pytest.mark.parametrize(
    "expiry",
    [
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}],
        kube.ApiError(410, "Gone", "too old resource version"),
    ],
)
def test_an_expired_version_means_listing_again(expiry: Any) -> None:
    api = FakeWatchApi([], "4", [expiry])
    jobs = _informer(api, ClusterCache(), [], [NS])
    with pytest.raises(informer._ExpiredError):
        jobs.watch("4")


def test_the_informer_thread_lists_again_after_a_broken_watch_and_reports_synced() -> None:
    api = FakeWatchApi([_job(0, 3)], "4", [kube.ApiError(0, "WatchBroken", "connection reset")] + [[]] * 1000)
    cache = ClusterCache()
    jobs = _informer(api, cache, [], [NS])
    jobs.start()
    try:
        assert jobs.synced.wait(5)
        for _ in range(100):
            if api.lists >= 2:
                break
            jobs._stopped.wait(0.05)
    finally:
        jobs.stop()
    assert api.lists >= 2  # listed, watch broke, listed again (after a short pause)
    assert len(cache.children(NS, "demo", "Job")) == 1
