"""The per-TrainingJob series: what a job's status says, for as long as the job is in the cache; and the
one endpoint a replica serves, before and after it leads."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubetrain_operator.runtime.cache import ClusterCache
from kubetrain_operator.runtime.controller import Controller
from kubetrain_operator.runtime.metrics import Endpoint, Metrics
from operator_fakes import NS, trainingjob
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.unit

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

RUNNING = {
    "phase": "Running",
    "conditions": [
        {"type": "Created", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "Running", "status": "True", "lastTransitionTime": "2026-01-01T00:10:00Z"},
    ],
    "restarts": 2,
    "disruptionRestarts": 1,
    "progress": {
        "epoch": 3,
        "epochs": 10,
        "step": 1200,
        "loss": 0.75,
        "validationLoss": 0.875,
        "accuracy": 0.625,
        "imagesPerSecond": 2400.5,
        "updatedAt": "2026-01-01T00:20:00Z",
    },
}
T_RUNNING = 1767226200.0  # 2026-01-01T00:10:00Z
T_REPORT = 1767226800.0  # 2026-01-01T00:20:00Z


def job(name: str, status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body = trainingjob(name, status=status)
    body["metadata"]["uid"] = f"uid-{name}"
    body["spec"].update(spec)
    return body


def wired() -> tuple[ClusterCache, Metrics]:
    """A cache and the metrics of a controller built on it (the controller points the metrics at it)."""
    cache = ClusterCache()
    controller = Controller(None, cache, metrics=Metrics.create())  # type: ignore[arg-type]
    return cache, controller.metrics


def scrape(metrics: Metrics) -> Samples:
    """The per-job samples as Prometheus reads them: (name, labels) -> value."""
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("kubetrain_trainingjob_")
    }


def of(samples: Samples, name: str) -> Samples:
    """The samples of TrainingJob `name`."""
    return {key: value for key, value in samples.items() if ("trainingjob", name) in key[1]}


def test_a_running_jobs_series_say_what_its_status_says() -> None:
    cache, metrics = wired()
    cache.observe(job("demo", RUNNING))
    labels = (("namespace", NS), ("trainingjob", "demo"))
    phases = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
    assert scrape(metrics) == {
        **{
            ("kubetrain_trainingjob_phase", tuple(sorted((*labels, ("phase", p))))): float(p == "Running")
            for p in phases
        },
        ("kubetrain_trainingjob_restarts_total", (("cause", "failure"), *labels)): 2.0,
        ("kubetrain_trainingjob_restarts_total", (("cause", "disruption"), *labels)): 1.0,
        ("kubetrain_trainingjob_epoch", labels): 3.0,
        ("kubetrain_trainingjob_step", labels): 1200.0,
        ("kubetrain_trainingjob_training_loss", labels): 0.75,
        ("kubetrain_trainingjob_validation_loss", labels): 0.875,
        ("kubetrain_trainingjob_validation_accuracy", labels): 0.625,
        ("kubetrain_trainingjob_images_per_second", labels): 2400.5,
        ("kubetrain_trainingjob_progress_timestamp_seconds", labels): T_REPORT,
        ("kubetrain_trainingjob_running_since_timestamp_seconds", labels): T_RUNNING,
    }


def test_before_the_first_report_there_is_no_progress_and_only_running_has_a_running_since() -> None:
    cache, metrics = wired()
    pending = {
        "phase": "Pending",
        "conditions": [{"type": "Running", "status": "False", "lastTransitionTime": "2026-01-01T00:30:00Z"}],
    }
    cache.observe(job("waiting", pending))
    cache.observe(job("new", {}))
    samples = scrape(metrics)
    pending_phase = (("namespace", NS), ("phase", "Pending"), ("trainingjob", "waiting"))
    assert {key: value for key, value in of(samples, "waiting").items() if value} == {
        ("kubetrain_trainingjob_phase", pending_phase): 1.0
    }
    assert len(of(samples, "waiting")) == 6 + 2  # the phases and the restart causes, nothing else
    # No status yet: no phase, no restarts so far
    assert {name for name, _ in of(samples, "new")} == {"kubetrain_trainingjob_restarts_total"}
    assert set(of(samples, "new").values()) == {0.0}


def test_a_deleted_jobs_series_go_with_it_and_the_others_stay() -> None:
    cache, metrics = wired()
    doomed, kept = job("doomed", RUNNING), job("kept", RUNNING)
    cache.observe(doomed)
    cache.observe(kept)
    assert len(of(scrape(metrics), "doomed")) == len(of(scrape(metrics), "kept")) == 16
    cache.forget(copy.deepcopy(doomed))
    samples = scrape(metrics)
    assert of(samples, "doomed") == {}
    assert len(of(samples, "kept")) == 16


def test_a_job_another_controller_manages_has_no_series() -> None:
    cache, metrics = wired()
    cache.observe(job("elsewhere", RUNNING, managedBy="kueue.x-k8s.io/multikueue"))
    assert scrape(metrics) == {}


def test_a_status_of_the_wrong_shape_leaves_its_series_out() -> None:
    cache, metrics = wired()
    broken = {
        "phase": "Exploded",
        "restarts": "two",
        "progress": {"epoch": True, "loss": "low", "updatedAt": "yesterday"},
    }
    cache.observe(job("odd", broken))
    cache.observe(job("odder", {"progress": {"updatedAt": 1767226800}}))
    assert {name for name, _ in scrape(metrics)} == {"kubetrain_trainingjob_restarts_total"}
    assert set(scrape(metrics).values()) == {0.0}


def exposition(endpoint: Endpoint) -> dict[str, float]:
    """Every unlabelled sample of the endpoint's registry, and the names of the others (value nan)."""
    text = generate_latest(endpoint.registry).decode()
    return {
        sample.name: sample.value if not sample.labels else float("nan")
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_standby_serves_its_process_and_leading_0_and_leading_adds_the_operators_series() -> None:
    """`lead()` may run twice (kopf retries a startup handler that failed): the same metrics, no error."""
    endpoint = Endpoint.create()
    standby = exposition(endpoint)
    assert {name: standby[name] for name in standby if name.startswith("kubetrain_")} == {
        "kubetrain_leader_election_leading": 0.0
    }
    assert "python_info" in standby
    operator = endpoint.lead()
    assert endpoint.lead() is operator
    cache = ClusterCache()
    Controller(None, cache, metrics=operator)  # type: ignore[arg-type]
    cache.observe(job("demo", RUNNING))
    leading = exposition(endpoint)
    assert leading["kubetrain_leader_election_leading"] == 1.0
    assert {"kubetrain_trainingjob_epoch", "kubetrain_workqueue_depth", "python_info"} <= set(leading)
