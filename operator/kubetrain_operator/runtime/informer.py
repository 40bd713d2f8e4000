"""Informers: list-then-watch threads that keep the cache's TrainingJobs, Services, Jobs and Pods current
(and, where Kueue is installed, the TrainingJobs' Workloads and Kueue's ResourceFlavors).

Why not kopf for these: kopf gives every event of every object its own asyncio worker, body views,
cause detection, a logger and handler invocation through its execution machinery. A TrainingJob's group
makes dozens of child events (4 Jobs and 4 pods going through creation, scheduling, running, finishing),
so at 500 submitted jobs kopf's per-event work was most of the operator's CPU, taken from the same cores
the API server needed. An informer thread parses each event line, files a slim copy and asks for one
coalesced reconcile: a tenth of the cost. TrainingJobs went the same way later: their events are few
(creation, status writes and their echoes, about three per job), but kopf still spent about 3 ms of CPU
on each, a third of the operator's CPU at N = 500 (benchmarks/results/operator-profile-n500.md).

Correctness, as in client-go's reflector: a paginated list gives a snapshot and its resourceVersion,
and the watch continues from exactly there (with bookmarks, so a quiet stream still advances). When the
server says the version is too old (410 Gone) or the connection breaks, the informer lists again, and
`ClusterCache.sweep` drops what was deleted in between, so no deletion is ever missed. `synced` is set
after the first complete listing; the controller plans nothing before every informer is synced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from fnmatch import fnmatch
from typing import Any

from kubetrain_operator.api import constants
from kubetrain_operator.runtime import kube
from kubetrain_operator.runtime.cache import CHILD_KINDS, CLUSTER_KINDS, ClusterCache, Key

logger = logging.getLogger("kubetrain.operator")

CHILD_EVENT_DELAY = 0.5
"""Seconds between a child's event and the reconcile it asks for. A group's Jobs and pods change in bursts
(created, scheduled, running, finished: dozens of events per TrainingJob); every event of one job within
this window shares one reconcile (the controller keeps one pending wake-up per job)."""

LIST_PAGE = 100
"""Objects per page of a listing. A page is parsed whole before its objects are slimmed, and the process
keeps that peak: small pages keep it small, for a few more requests (10 per 1,000 pods)."""

RETRY_DELAYS = (0.5, 1.0, 2.0, 5.0)
"""Seconds before listing again after the k-th consecutive failure (the API server may be down)."""
MIN_WATCH_SECONDS = 1.0
"""A watch the server ends sooner than this is reopened only after this pause (no tight loop)."""

Scope = tuple[str | None, Callable[[str], bool]]
"""A namespace to list and watch (None: all) and the test of which namespaces in it are watched."""

CLUSTER_SCOPE: Scope = (None, lambda namespace: True)
"""The scope of a cluster-scoped kind: its objects have no namespace ("")."""


def scopes(namespaces: list[str] | None) -> list[Scope]:
    """Literal namespaces: one scope each (what a namespaced Role allows). All namespaces or kopf-style
    glob patterns: one cluster-wide scope, filtered by the patterns."""
    if namespaces and not any(char in pattern for pattern in namespaces for char in "*?["):
        return [(ns, lambda candidate, ns=ns: candidate == ns) for ns in namespaces]
    return [(None, lambda candidate: not namespaces or any(fnmatch(candidate, p) for p in namespaces))]


class _ExpiredError(Exception):
    """The watch's resourceVersion is too old for the API server (410 Gone): list again."""


class Informer:
    """One kind of child in one scope, listed and watched into the cache by one daemon thread."""

    def __init__(
        self,
        client: kube.Kube,
        cache: ClusterCache,
        kind: str,
        scope: Scope,
        on_change: Callable[[Key], None],
    ) -> None:
        self.kube = client
        self.cache = cache
        self.kind = kind
        self.namespace, self.in_scope = scope
        self.label_selector = (
            None if kind in CLUSTER_KINDS or kind == constants.KIND else constants.LABEL_JOB_NAME
        )
        """Children carry the job-name label; TrainingJobs and Kueue's cluster-scoped kinds are all read."""
        self.on_change = on_change
        self.synced = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"kubetrain-informer-{kind}-{self._where()}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current request (the thread is a daemon: a pending watch never blocks exit)."""
        self._stopped.set()

    def _run(self) -> None:
        failures = 0
        while not self._stopped.is_set():
            try:
                version = self.relist()
                self.synced.set()
                failures = 0
                while not self._stopped.is_set():
                    opened = time.monotonic()
                    version = self.watch(version)
                    if time.monotonic() - opened < MIN_WATCH_SECONDS:  # closed at once: do not spin
                        self._stopped.wait(MIN_WATCH_SECONDS)
            except _ExpiredError:
                continue
            except Exception as exc:  # the API server is away or refused us: list again after a pause
                delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
                failures += 1
                logger.warning(
                    "%s informer (%s): %s; listing again in %.1fs", self.kind, self._where(), exc, delay
                )
                self._stopped.wait(delay)

    def relist(self) -> str:
        """List everything into the cache, dropping what disappeared; returns the listing's version."""
        versions: list[str] = []

        def pages() -> Iterator[tuple[list[dict[str, Any]], str]]:
            listing = self.kube.list_pages(self.kind, self.namespace, self.label_selector, LIST_PAGE)
            for items, version in listing:
                versions.append(version)
                yield items, version

        for key in self.cache.sweep(self.kind, pages(), self.in_scope):
            self.on_change(key)
        return versions[-1] if versions else ""

    def watch(self, version: str) -> str:
        """Apply watch events from `version` on until the server ends the stream; returns the last version
        seen. Raises _ExpiredError when the server no longer has `version`."""
        try:
            for event in self.kube.watch(self.kind, self.namespace, self.label_selector, version):
                version = self.apply(event) or version
                if self._stopped.is_set():
                    break
        except kube.ApiError as exc:
            if exc.status == 410:
                raise _ExpiredError from exc
            raise
        return version

    def apply(self, event: dict[str, Any]) -> str | None:
        """File one watch event in the cache and ask for its TrainingJob's reconcile; returns the event's
        resourceVersion."""
        type_ = event.get("type")
        obj = event.get("object") or {}
        if type_ == "ERROR":
            if obj.get("code") == 410:
                raise _ExpiredError
            raise kube.ApiError(obj.get("code") or 0, obj.get("reason") or "Error", obj.get("message") or "")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        namespace = (obj.get("metadata") or {}).get("namespace") or ""
        if type_ == "BOOKMARK" or not self.in_scope(namespace):
            return version
        obj.setdefault("kind", self.kind)
        key = self.cache.forget(obj) if type_ == "DELETED" else self.cache.observe(obj)
        if key is not None:
            self.on_change(key)
        return version

    def _where(self) -> str:
        return self.namespace or "all namespaces"


def informers(
    client: kube.Kube,
    cache: ClusterCache,
    namespaces: list[str] | None,
    *,
    on_trainingjob: Callable[[Key], None],
    on_child: Callable[[Key], None],
    kueue: bool = False,
) -> list[Informer]:
    """One informer per scope for TrainingJobs (`on_trainingjob`: the key of one added, changed or gone)
    and one per child kind and scope (`on_child`); with `kueue`, Kueue's (`kueue_informers`) too."""
    kinds = [kind for kind in CHILD_KINDS if kind != "Workload"]
    out = [Informer(client, cache, constants.KIND, scope, on_trainingjob) for scope in scopes(namespaces)]
    out += [Informer(client, cache, kind, scope, on_child) for kind in kinds for scope in scopes(namespaces)]
    return out + (kueue_informers(client, cache, namespaces, on_child) if kueue else [])


def kueue_informers(
    client: kube.Kube, cache: ClusterCache, namespaces: list[str] | None, on_change: Callable[[Key], None]
) -> list[Informer]:
    """Workloads in each scope and the cluster's ResourceFlavors: at start when Kueue is served, or
    started later when Kueue is installed after the operator (`discovery.LateAPIs`)."""
    out = [Informer(client, cache, "Workload", scope, on_change) for scope in scopes(namespaces)]
    return out + [Informer(client, cache, kind, CLUSTER_SCOPE, on_change) for kind in CLUSTER_KINDS]


def when_synced(started: list[Informer], then: Callable[[], None]) -> None:
    """Call `then` (from a helper thread) once every informer has completed its first listing."""

    def wait() -> None:
        for each in started:
            each.synced.wait()
        then()

    threading.Thread(target=wait, name="kubetrain-cache-sync", daemon=True).start()
