"""The operator's in-memory view of TrainingJobs and their Services, Jobs and Pods.

Why it exists: reading a TrainingJob and its children from the API server before every reconcile cost four
requests per reconcile (GET TrainingJob, GET Service, LIST Jobs, LIST Pods), most of what the operator
asked of the API server, while watches were already delivering every one of those objects. A
reconcile now reads this cache and makes requests only to change something.

Fed by the `informer` threads, one per kind and scope (TrainingJobs, Services, Jobs, Pods and Kueue's
kinds). The controller plans nothing before every informer has listed once, so no reconcile ever plans
from a half-filled cache (which would see a running group's workers as missing and its status go
backwards).

Stale reads are safe: the cache trails the API server by the watch delay, and every write guards itself.
Status patches carry the TrainingJob's resourceVersion (a decision taken on an old read fails with 409
and is planned again), creations use deterministic names (a repeated create fails with 409
AlreadyExists, and counts as done only for an object this TrainingJob controls), deletions tolerate 404
and carry the uid they were planned from. Names cannot guard a creation after a deletion, though: the
children's watches and the TrainingJobs' are separate streams, so the garbage collector's removal of a
deleted TrainingJob's children can arrive before the TrainingJob's own deletion, and the cache shows a
running job with every child missing. So a creation that is not a TrainingJob's first is made only after
a GET confirms the TrainingJob is still the version planned from (`Controller._owner_confirmed`).

The controller also records the objects its own writes return (`observe` again), so the reconcile after a
write does not repeat it while the watch event is on its way; of two copies of an object the one with the
higher resourceVersion wins.

Departed pods: a worker pod the cluster took away (its DisruptionTarget condition) is deleted as soon
as the Job controller has failed its Job by the podFailurePolicy, often before a reconcile reads it, and
the Job keeps only the verdict ("has condition DisruptionTarget"), not which component took the pod, from
which node, or how it exited. The watch's DELETED event carries the pod's last state: the cache keeps it
under its Job's uid while the Job is cached (one per Job, dropped with the Job), so the planner can still
say "evicted through the Eviction API" rather than "disrupted". An operator that restarts in between
loses it, and the verdict alone is what is left.

Slim copies: only what the planner reads is kept (no managedFields, no kubectl last-applied annotation,
no Job or Service spec, a Pod's spec reduced to its node and scheduler), about a tenth of a Pod's size.
Stored objects are never mutated, only replaced, so readers get them without copying.

Thread-safe: fed from the informer threads, read from the controller's worker threads, under one lock
held only for dict operations.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubetrain_operator.api import constants, jobstatus
from kubetrain_operator.planning import observe

Key = tuple[str, str]
"""(namespace, name) of a TrainingJob."""

CHILD_KINDS = ("Service", "Job", "Pod", "Workload")
"""Kinds filed under their TrainingJob. Workloads (Kueue's) are watched only where Kueue is installed."""
CLUSTER_KINDS = ("ResourceFlavor",)
"""Cluster-scoped kinds kept by name, shared by every TrainingJob (Kueue's ResourceFlavors)."""
API_GROUPS = {
    constants.KIND: constants.GROUP,
    "Service": "",
    "Job": "batch",
    "Pod": "",
    "Workload": constants.KUEUE_GROUP,
    "ResourceFlavor": constants.KUEUE_GROUP,
}
"""The API group of each kind the cache files. Kinds share names across groups: scheduling.k8s.io has a
Workload too (the gang of provider kubernetes), and taking it for Kueue's made a finished gang job write
Kueue status to a Workload Kueue never had, for ever. An object of another group is not filed; one without
apiVersion (an item of a list of one kind) is taken as its kind's."""
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
POD_SPEC_KEPT = ("nodeName", "schedulerName")
WORKLOAD_SPEC_KEPT = ("active", "queueName")
"""A Workload's pod sets are the operator's own building: only what Kueue or a user may change is kept,
and of the pod sets their names and counts (an elastic job's Workload follows spec.workers while queued)."""


def owner_name(body: Mapping[str, Any]) -> str | None:
    """The TrainingJob a child belongs to: its TrainingJob owner reference, else the pod annotation (full
    name, labels are cut at 63 characters), else the job-name label."""
    meta = body.get("metadata") or {}
    for ref in meta.get("ownerReferences") or ():
        if ref.get("kind") == constants.KIND and ref.get("apiVersion", "").startswith(constants.GROUP + "/"):
            return ref.get("name")
    annotations = meta.get("annotations") or {}
    if constants.ANNOTATION_JOB_NAME in annotations:
        return annotations[constants.ANNOTATION_JOB_NAME]
    return (meta.get("labels") or {}).get(constants.LABEL_JOB_NAME)


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an object the planner reads; the rest of it is shared with `body`, never copied. A
    TrainingJob's status that is only the schema's default (UNWRITTEN_STATUS) is left out: to the planner
    a status the operator never wrote is none."""
    kind = body.get("kind")
    meta = {key: value for key, value in (body.get("metadata") or {}).items() if key != "managedFields"}
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    out: dict[str, Any] = {"apiVersion": body.get("apiVersion"), "kind": kind, "metadata": meta}
    spec = body.get("spec") or {}
    if kind == "Pod":
        out["spec"] = {key: spec[key] for key in POD_SPEC_KEPT if key in spec}
    elif kind == "Workload":
        out["spec"] = {key: spec[key] for key in WORKLOAD_SPEC_KEPT if key in spec}
        if "podSets" in spec:
            out["spec"]["podSets"] = [
                {"name": pod_set.get("name"), "count": pod_set.get("count", 1)} for pod_set in spec["podSets"]
            ]
    elif kind not in ("Job", "Service"):
        out["spec"] = spec
    if "status" in body and not (kind == constants.KIND and body["status"] == jobstatus.UNWRITTEN_STATUS):
        out["status"] = body["status"]
    return out


def _identity(body: Mapping[str, Any]) -> tuple[str | None, str | None, str | None, str | None]:
    """kind (None for an object of a group the cache does not file), namespace, name, uid."""
    meta = body.get("metadata") or {}
    kind, api_version = body.get("kind"), body.get("apiVersion")
    if api_version is not None and API_GROUPS.get(kind or "") != api_version.rpartition("/")[0]:
        kind = None
    return kind, meta.get("namespace"), meta.get("name"), meta.get("uid")


def _as_int(version: Any) -> int | None:
    try:
        return int(version)
    except (TypeError, ValueError):
        return None


def _resource_version(body: Mapping[str, Any]) -> int | None:
    return _as_int((body.get("metadata") or {}).get("resourceVersion"))


def _supersedes(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether `new` is at least as recent as `old`. resourceVersions are opaque by contract but etcd's
    are increasing integers; where one is not, the later arrival wins."""
    if old is None:
        return True
    new_version, old_version = _resource_version(new), _resource_version(old)
    if new_version is None or old_version is None:
        return True
    return new_version >= old_version


class ClusterCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trainingjobs: dict[Key, dict[str, Any]] = {}
        self._children: dict[str, dict[Key, dict[str, dict[str, Any]]]] = {kind: {} for kind in CHILD_KINDS}
        self._cluster: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in CLUSTER_KINDS}
        self._placed: dict[tuple[str, str], Key] = {}
        """(kind, uid) -> the TrainingJob key its copy is filed under (to move or drop it)."""
        self._departed: dict[Key, dict[str, dict[str, Any]]] = {}
        """TrainingJob key -> Job uid -> the last state of its disrupted pod, deleted while the Job stays."""

    # ------------------------------------------------------------ feeding

    def observe(self, body: Mapping[str, Any]) -> Key | None:
        """Store (or replace with) a slim copy of `body`; return the TrainingJob it concerns, if any."""
        kind, namespace, name, uid = _identity(body)
        if kind in CLUSTER_KINDS and name:
            with self._lock:
                if _supersedes(body, self._cluster[kind].get(name)):
                    self._cluster[kind][name] = slim(body)
            return None
        if not namespace or not name:
            return None
        if kind == constants.KIND:
            key = (namespace, name)
            copy = slim(body)
            with self._lock:
                current = self._trainingjobs.get(key)
                same_object = current is not None and current["metadata"].get("uid") == uid
                if not same_object or _supersedes(copy, current):
                    self._trainingjobs[key] = copy
            return key
        if kind not in CHILD_KINDS or not uid:
            return None
        owner = owner_name(body)
        if owner is None:
            return None
        key = (namespace, owner)
        copy = slim(body)
        with self._lock:
            placed = self._placed.get((kind, uid))
            if placed is not None and placed != key:
                self._drop_child(kind, uid, placed)
            group = self._children[kind].setdefault(key, {})
            if _supersedes(copy, group.get(uid)):
                group[uid] = copy
                self._placed[(kind, uid)] = key
        return key

    def forget(self, body: Mapping[str, Any]) -> Key | None:
        """Drop a deleted object; return the TrainingJob it concerned, if any."""
        kind, namespace, name, uid = _identity(body)
        if kind in CLUSTER_KINDS and name:
            with self._lock:
                self._cluster[kind].pop(name, None)
            return None
        if not namespace or not name:
            return None
        if kind == constants.KIND:
            key = (namespace, name)
            with self._lock:
                current = self._trainingjobs.get(key)
                if current is not None and current["metadata"].get("uid") in (uid, None):
                    del self._trainingjobs[key]
            return key
        if kind not in CHILD_KINDS or not uid:
            return None
        with self._lock:
            key = self._placed.get((kind, uid))
            if key is not None:
                self._drop_child(kind, uid, key)
                if kind == "Pod":
                    self._keep_departed(body, key)
        return key

    def _keep_departed(self, pod: Mapping[str, Any], key: Key) -> None:
        """Keep a deleted pod's last state when the cluster took it away and its Job is still cached."""
        job_uid = observe.controller_uid(pod)
        if job_uid is None or observe.disruption_of(pod) is None:
            return
        if self._placed.get(("Job", job_uid)) != key:
            return  # its Job went first: nothing will ask, and nothing would drop the copy
        self._departed.setdefault(key, {})[job_uid] = slim(pod)

    def _drop_child(self, kind: str, uid: str, key: Key) -> None:
        group = self._children[kind].get(key)
        if group is not None:
            group.pop(uid, None)
            if not group:
                del self._children[kind][key]
        self._placed.pop((kind, uid), None)
        if kind == "Job":
            departed = self._departed.get(key)
            if departed is not None and departed.pop(uid, None) is not None and not departed:
                del self._departed[key]

    def sweep(
        self, kind: str, pages: Iterable[tuple[list[dict[str, Any]], str]], in_scope: Callable[[str], bool]
    ) -> set[Key]:
        """Make the cache agree with a complete, fresh listing of `kind` (pages of one snapshot).

        Why: an informer lists again after a broken watch (410 Gone, a lost connection), and the watch
        that follows starts from the listing, so nothing reports what changed or disappeared in between: a
        deletion missed then would leave a ghost here forever (a deleted worker Job counted as running),
        a missed change a stale copy (a finished Job counted as running). A cached object in scope that
        the snapshot lacks is dropped if it is not newer than the snapshot (newer ones were created after
        it); listed objects the cache missed, or holds at an older version, are taken in. Returns the
        TrainingJobs concerned, to reconcile.
        """
        listed: set[str] = set()
        snapshot: int | None = None
        touched: set[Key] = set()
        for items, version in pages:
            snapshot = _as_int(version)
            for item in items:
                meta = item.get("metadata") or {}
                listed.add(meta.get("uid", ""))
                if not self._holds_current(kind, item):
                    key = self.observe(item)
                    if key is not None:
                        touched.add(key)
        if snapshot is None:
            return touched
        with self._lock:
            if kind == constants.KIND:
                cached = list(self._trainingjobs.items())
            elif kind in CLUSTER_KINDS:
                cached = [(("", name), body) for name, body in self._cluster[kind].items()]
            else:
                groups = self._children[kind].items()
                cached = [(key, body) for key, group in groups for body in group.values()]
        for key, body in cached:
            version = _resource_version(body)
            uid = body["metadata"].get("uid", "")
            if in_scope(key[0]) and uid not in listed and version is not None and version <= snapshot:
                self.forget(body)
                touched.add(key)
        return touched

    def _holds_current(self, kind: str, body: Mapping[str, Any]) -> bool:
        """Whether the cache holds `body`'s object (same uid) at its version or a later one."""
        meta = body.get("metadata") or {}
        with self._lock:
            if kind == constants.KIND:
                current = self._trainingjobs.get((meta.get("namespace"), meta.get("name")))
            elif kind in CLUSTER_KINDS:
                current = self._cluster[kind].get(meta.get("name", ""))
            else:
                key = self._placed.get((kind, meta.get("uid", "")))
                current = None if key is None else self._children[kind].get(key, {}).get(meta.get("uid", ""))
        if current is None or current["metadata"].get("uid") != meta.get("uid"):
            return False
        listed, held = _resource_version(body), _resource_version(current)
        return listed is not None and held is not None and held >= listed

    # ------------------------------------------------------------ reading

    def trainingjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._trainingjobs.get((namespace, name))

    def trainingjobs(self) -> list[dict[str, Any]]:
        """Every cached TrainingJob (a copy of the index, objects shared): what the metrics report on."""
        with self._lock:
            return list(self._trainingjobs.values())

    def cluster_objects(self, kind: str) -> dict[str, dict[str, Any]]:
        """The cached cluster-scoped objects of `kind` by name (a copy of the index, objects shared)."""
        with self._lock:
            return dict(self._cluster[kind])

    def departed_pods(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        """Job uid -> the last state of that Job's disrupted pod, deleted while the Job is still cached,
        for the TrainingJob `name` (a copy of the index, objects shared)."""
        with self._lock:
            return dict(self._departed.get((namespace, name)) or {})

    def children(self, namespace: str, name: str, kind: str) -> list[dict[str, Any]]:
        """The cached objects of `kind` filed under the TrainingJob `name` (any owner uid: the planner
        keeps those of the current TrainingJob)."""
        with self._lock:
            return list((self._children[kind].get((namespace, name)) or {}).values())
