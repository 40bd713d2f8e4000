"""Helpers of the chaos suite: manifests, waiting, and the status-history watcher that judges the operator."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from testcluster import manifests
from testcluster.cluster import Cluster
from testcluster.operator_process import OperatorProcess
from testcluster.waiting import wait_for

WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "namespaces": ["kube-node-lease"]},  # kwok's node heartbeats
        {
            "level": "Metadata",
            "verbs": WRITE_VERBS,
            "resources": [
                {"group": "", "resources": ["services", "events"]},
                {"group": "batch", "resources": ["jobs"]},
                {"group": "kubetrain.io", "resources": ["trainingjobs", "trainingjobs/status"]},
                {"group": "coordination.k8s.io", "resources": ["leases"]},
                {"group": "scheduling.k8s.io", "resources": ["workloads", "workloads/status", "podgroups"]},
                {"group": "kueue.x-k8s.io", "resources": ["workloads", "workloads/status"]},
            ],
        },
        {"level": "None"},
    ],
}
"""Audit every write an operator can make (children, status, events, its Lease, gang and Kueue
Workloads, the latter also where no Kueue is installed), and nothing else: the
Metadata level records who (user agent), what, and when the API server received it."""


def writes_by(audit_log: Path, user_agent_part: str, since: datetime) -> list[str]:
    """The writes whose user agent contains `user_agent_part` that the API server received at or after
    `since`, as 'VERB resource/name (status code)' lines."""
    found = []
    for line in audit_log.read_text().splitlines():
        entry = json.loads(line)
        if user_agent_part not in entry.get("userAgent", "") or entry.get("verb") not in WRITE_VERBS:
            continue
        received = datetime.fromisoformat(entry["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if received >= since:
            ref = entry.get("objectRef", {})
            code = entry.get("responseStatus", {}).get("code")
            found.append(
                f"{entry['verb']} {ref.get('resource')}/{ref.get('name', '')} ({code}) at {received}"
            )
    return found


PHASE_RANK = {None: -2, "Restarting": -1, "Pending": 0, "Running": 1, "Succeeded": 2, "Failed": 2}
"""Where a phase lies in one attempt: a status may only move forward through (restarts, rank)."""


def trainingjob(name: str, *, workers: int = 2, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """The chaos suite's jobs may restart up to three times."""
    return manifests.trainingjob(name, workers=workers, annotations=annotations, runPolicy={"maxRestarts": 3})


def submit(cluster: Cluster, namespace: str, manifests: list[dict[str, Any]]) -> None:
    """All in one request, so the operator sees a burst."""
    cluster.kubectl(
        "-n", namespace, "create", "-f", "-",
        input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}),
    )  # fmt: skip


def statuses(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    """Every TrainingJob's status; {} while the API server is unreachable."""
    result = cluster.run_kubectl(
        "-n", namespace, "get", "trainingjobs", "-o", "json", "--request-timeout=10s"
    )
    if result.returncode != 0:
        return {}
    return {item["metadata"]["name"]: item.get("status") or {} for item in json.loads(result.stdout)["items"]}


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, operator: OperatorProcess) -> Any:
    return wait_for(
        predicate, what, timeout, interval=1.0, explain=lambda: f"operator log:\n{operator.log_tail(80)}"
    )


def all_in_phase(cluster: Cluster, namespace: str, names: list[str], phase: str) -> Callable[[], bool]:
    def check() -> bool:
        current = statuses(cluster, namespace)
        return all(current.get(name, {}).get("phase") == phase for name in names)

    return check


class StatusHistory:
    """Every status a watch shows for the namespace's TrainingJobs, as (phase, restarts), in order.

    A watch may skip intermediate versions (it never reorders them), so a regression in what the API
    server stored shows up as a regression here.
    """

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self._api = client.ApiClient(config.load_kube_config(config_file=str(cluster.kubeconfig)) or None)
        self._namespace = namespace
        self.history: dict[str, list[tuple[str | None, int]]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> StatusHistory:
        self._thread.start()
        return self

    def _run(self) -> None:
        objects = client.CustomObjectsApi(self._api)
        args = ("kubetrain.io", "v1alpha1", self._namespace, "trainingjobs")
        resource_version = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    listing = objects.list_namespaced_custom_object(*args)
                    resource_version = listing["metadata"]["resourceVersion"]
                    for item in listing["items"]:
                        self._record(item)
                for event in watch.Watch().stream(
                    objects.list_namespaced_custom_object,
                    *args,
                    resource_version=resource_version,
                    timeout_seconds=5,
                ):
                    resource_version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(event["object"])
                    if self._stop.is_set():
                        break
            except Exception as exc:  # API server away, or 410 Gone: list again
                if getattr(exc, "status", None) == 410:
                    resource_version = None
                time.sleep(0.5)

    def _record(self, obj: dict[str, Any]) -> None:
        status = obj.get("status") or {}
        entry = (status.get("phase"), int(status.get("restarts") or 0))
        seen = self.history[obj["metadata"]["name"]]
        if not seen or seen[-1] != entry:
            seen.append(entry)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def regressions(self) -> dict[str, list[tuple[str | None, int]]]:
        """TrainingJobs whose (restarts, phase rank) ever went down, with their whole history."""
        out = {}
        for name, seen in self.history.items():
            keys = [(restarts, PHASE_RANK.get(phase, -3)) for phase, restarts in seen]
            if any(later < earlier for earlier, later in itertools.pairwise(keys)):
                out[name] = seen
        return out
