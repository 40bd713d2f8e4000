"""Prometheus metrics of the operator, served by `kubetrain operator --metrics-port`.

Two kinds. The operator's own: counters of TrainingJob transitions per namespace, reconcile durations and
errors, active jobs, the work queue's depth, updated as the controller works. And per TrainingJob
(`TrainingJobCollector`): its phase, restarts and training progress, read from the TrainingJobs in the
operator's cache at every scrape, so a job's series exist exactly as long as the job does (a deleted
job's vanish with it from the cache, with no bookkeeping that could leak) and say what its status says.

Every replica serves /metrics from its start to its end, on one server (`Endpoint`): a standby (leader
election on, not leading) serves the process's and the Python runtime's series and
kubetrain_leader_election_leading 0, so that it is a healthy scrape target like any Ready pod; the
replica that leads adds the two kinds above to the same registry, so each of their series comes from one
replica only. One registry per process (not the global default one) so tests can build their own.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kubetrain_operator.api import jobstatus
from kubetrain_operator.planning import observe, planner
from kubetrain_operator.planning import status as st

JOB_LABELS = ("namespace", "trainingjob")
"""The labels of every per-TrainingJob series: its namespace and name."""
PHASES: tuple[str, ...] = typing.get_args(jobstatus.Phase)
PROGRESS_GAUGES = (
    ("epoch", "epoch", "The last epoch rank 0 reported (status.progress.epoch, 1-based)."),
    ("step", "step", "The optimizer steps done at the last report (status.progress.step)."),
    ("training_loss", "loss", "The mean training loss of the last reported epoch (status.progress.loss)."),
    (
        "validation_loss",
        "validationLoss",
        "The loss on the validation split at the last report (status.progress.validationLoss).",
    ),
    (
        "validation_accuracy",
        "accuracy",
        "The accuracy on the validation split at the last report, 0..1 (status.progress.accuracy).",
    ),
    (
        "images_per_second",
        "imagesPerSecond",
        "The last reported epoch's training throughput, all workers together "
        "(status.progress.imagesPerSecond).",
    ),
)
"""(metric name after kubetrain_trainingjob_, status.progress key, help) of the progress gauges."""
RESTART_CAUSES = (("failure", "restarts"), ("disruption", "disruptionRestarts"))
"""(label cause, status field) of kubetrain_trainingjob_restarts_total."""


@dataclasses.dataclass
class Metrics:
    registry: CollectorRegistry
    created: Counter
    succeeded: Counter
    failed: Counter
    restarted: Counter
    reconcile_seconds: Histogram
    reconcile_errors: Counter
    active: Gauge
    queue_depth: Gauge
    jobs: TrainingJobCollector

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        registry = registry or CollectorRegistry()
        labels = ("namespace",)
        return cls(
            registry=registry,
            created=Counter(
                "kubetrain_trainingjobs_created",
                "TrainingJobs whose workers were first created.",
                labels,
                registry=registry,
            ),
            succeeded=Counter(
                "kubetrain_trainingjobs_succeeded", "TrainingJobs that succeeded.", labels, registry=registry
            ),
            failed=Counter(
                "kubetrain_trainingjobs_failed", "TrainingJobs that failed.", labels, registry=registry
            ),
            restarted=Counter(
                "kubetrain_trainingjobs_restarted",
                "Restarts after worker failures or disruptions (a whole group, or an elastic job's worker).",
                labels,
                registry=registry,
            ),
            reconcile_seconds=Histogram(
                "kubetrain_reconcile_duration_seconds",
                "Duration of one reconcile of a TrainingJob (reads, plan, writes).",
                registry=registry,
                buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            ),
            reconcile_errors=Counter(
                "kubetrain_reconcile_errors",
                "Reconciles that ended in an error (retried).",
                registry=registry,
            ),
            active=Gauge(
                "kubetrain_trainingjobs_active",
                "TrainingJobs neither finished nor suspended, as last seen by this operator.",
                registry=registry,
            ),
            queue_depth=Gauge(
                "kubetrain_workqueue_depth",
                "TrainingJobs waiting for a reconcile thread.",
                registry=registry,
            ),
            jobs=TrainingJobCollector(registry),
        )

    def record(self, namespace: str, transitions: list[str]) -> None:
        counters = {
            "created": self.created,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "restarted": self.restarted,
        }
        for name in transitions:
            counters[name].labels(namespace=namespace).inc()


@dataclasses.dataclass
class Endpoint:
    """What one operator process serves on --metrics-port, for its whole life: one registry on one server,
    started before the leader election, so the port never closes nor changes hands when a standby leads.

    From the start: the process's series (process_*: CPU, memory, open files, start time), the Python
    runtime's (python_info, python_gc_*) and `leading`. `lead()` adds the operator's own (`Metrics`) to
    the same registry: a standby exports no operator or per-TrainingJob series (it has no cache, and its
    zeros would stand beside the leader's), so no series of ours comes from two replicas at once."""

    registry: CollectorRegistry
    leading: Gauge
    operator: Metrics | None = None
    """The operator's metrics, once `lead()` made them."""

    @classmethod
    def create(cls) -> Endpoint:
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        leading = Gauge(
            "kubetrain_leader_election_leading",
            "1 while this replica runs the operator (it holds the Lease, or runs without leader election), "
            "0 while it stands by.",
            registry=registry,
        )
        return cls(registry=registry, leading=leading)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Answer GET /metrics on `port` from a daemon thread until the process ends."""
        start_http_server(port, addr=addr, registry=self.registry)

    def lead(self) -> Metrics:
        """This replica runs the operator from now on: its metrics join the registry (once) and `leading`
        turns 1. Returns them, for the controller to update."""
        if self.operator is None:
            self.operator = Metrics.create(self.registry)
        self.leading.set(1)
        return self.operator


class TrainingJobCollector:
    """The per-TrainingJob series, built at every scrape from `source`: the TrainingJobs as the operator
    last saw them (the controller points it at its cache). Only jobs this operator manages count (a job
    whose spec.managedBy names another controller has that controller's status)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.source: Callable[[], Iterable[Mapping[str, Any]]] = tuple
        registry.register(self)

    def describe(self) -> list[Metric]:
        return trainingjob_families(())

    def collect(self) -> list[Metric]:
        return trainingjob_families(body for body in self.source() if planner.managed_here(body))


def trainingjob_families(bodies: Iterable[Mapping[str, Any]]) -> list[Metric]:
    """The per-TrainingJob metric families of `bodies`, from their status. Series appear only for what
    status holds: no progress gauges before rank 0's first report, no phase before the first status."""
    families: list[Metric] = [
        GaugeMetricFamily(
            "kubetrain_trainingjob_phase",
            "1 for the TrainingJob's phase (status.phase), 0 for the others.",
            labels=(*JOB_LABELS, "phase"),
        ),
        CounterMetricFamily(
            "kubetrain_trainingjob_restarts",
            "Restarts of the TrainingJob's workers by cause: failure (status.restarts, bounded by "
            "maxRestarts) or disruption (status.disruptionRestarts: evictions, preemptions, lost nodes).",
            labels=(*JOB_LABELS, "cause"),
        ),
        *(
            GaugeMetricFamily(f"kubetrain_trainingjob_{name}", text, labels=JOB_LABELS)
            for name, _, text in PROGRESS_GAUGES
        ),
        GaugeMetricFamily(
            "kubetrain_trainingjob_progress_timestamp_seconds",
            "When rank 0 wrote the last progress report (status.progress.updatedAt), Unix seconds.",
            labels=JOB_LABELS,
        ),
        GaugeMetricFamily(
            "kubetrain_trainingjob_running_since_timestamp_seconds",
            "While the TrainingJob is Running: when it last became Running (its Running condition's "
            "lastTransitionTime), Unix seconds. Absent in any other phase.",
            labels=JOB_LABELS,
        ),
    ]
    by_name = {family.name: family for family in families}
    for body in bodies:
        for name, labels, value in _job_samples(body):
            by_name[f"kubetrain_trainingjob_{name}"].add_metric(labels, value)
    return families


def _job_samples(body: Mapping[str, Any]) -> Iterator[tuple[str, list[str], float]]:
    """(family name after kubetrain_trainingjob_, label values, value) of one TrainingJob's series."""
    meta = body.get("metadata") or {}
    job = [meta.get("namespace", ""), meta.get("name", "")]
    status = body.get("status") or {}
    phase = status.get("phase")
    if phase in PHASES:
        for name in PHASES:
            yield "phase", [*job, name], float(name == phase)
    for cause, field in RESTART_CAUSES:
        count = status.get(field)
        yield "restarts", [*job, cause], float(count) if _is_number(count) else 0.0
    progress = status.get("progress") or {}
    for name, key, _ in PROGRESS_GAUGES:
        if _is_number(progress.get(key)):
            yield name, job, float(progress[key])
    updated = progress.get("updatedAt")
    reported = observe.parse_time(updated) if isinstance(updated, str) else None
    if reported is not None:
        yield "progress_timestamp_seconds", job, reported.timestamp()
    if phase == "Running" and st.is_true(status, "Running"):
        since = observe.parse_time((st.get_condition(status, "Running") or {}).get("lastTransitionTime"))
        if since is not None:
            yield "running_since_timestamp_seconds", job, since.timestamp()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
