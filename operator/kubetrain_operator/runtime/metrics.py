"""Prometheus metrics of the operator, served by `kubetrain operator --metrics-port`.

One registry per process (not the global default one) so tests can build their own.
"""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


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
                "Whole-group restarts after worker failures.",
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

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
