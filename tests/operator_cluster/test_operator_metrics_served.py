"""The operator's /metrics, scraped from the running process, against what docs/operations.md documents and what
the chart's dashboard and alert rules query; and a leader-election standby's, before and after it leads."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubetrain_operator.runtime import leader
from kubetrain_trainer import contract, progress
from prometheus_client.parser import text_string_to_metric_families
from testcluster import monitoring, processes
from testcluster.cluster import Cluster
from testcluster.manifests import trainingjob
from testcluster.operator_process import OperatorProcess, install_crd
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def documented_metrics() -> set[str]:
    """The metric names in docs/operations.md's Metrics bullet, as a user would type them into a query."""
    text = OPERATIONS.read_text()
    bullet = text[text.index("- **Metrics**") :]
    bullet = bullet[: bullet.index("\n- **", 1)]
    return set(re.findall(r"`(kubetrain_[a-z_]+)`", bullet))


Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape(url: str) -> Samples:
    """Every sample of the exposition: name -> labels -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def of_job(samples: Samples, namespace: str, name: str) -> dict[str, float]:
    """TrainingJob namespace/name's per-job samples: metric -> value; of the phase's, the current one's
    (value 1), of the restarts', the failures'."""
    return {
        metric: value
        for metric, by_labels in samples.items()
        for labels, value in by_labels.items()
        if ("namespace", namespace) in labels and ("trainingjob", name) in labels
        if metric != "kubetrain_trainingjob_phase" or value == 1.0
        if metric != "kubetrain_trainingjob_restarts_total" or ("cause", "failure") in labels
    }


def phase_of(samples: Samples, namespace: str, name: str) -> str | None:
    """The phase kubetrain_trainingjob_phase says TrainingJob namespace/name is in."""
    for labels, value in samples.get("kubetrain_trainingjob_phase", {}).items():
        if value == 1.0 and ("namespace", namespace) in labels and ("trainingjob", name) in labels:
            return dict(labels)["phase"]
    return None


def apply(cluster: Cluster, namespace: str, *manifests: dict[str, Any]) -> None:
    for manifest in manifests:
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(manifest))


def report_progress(cluster: Cluster, namespace: str, job: str, record: dict[str, object]) -> None:
    """Set rank 0's progress annotation, as the trainer's PodAnnotator does in a pod."""
    selector = f"kubetrain.io/job-name={job},kubetrain.io/worker-index=0"
    (rank0,) = cluster.kubectl("-n", namespace, "get", "pods", "-o", "name", "-l", selector).split()
    annotation = f"{contract.PROGRESS_ANNOTATION}={json.dumps(record)}"
    cluster.kubectl("-n", namespace, "annotate", "--overwrite", rank0, annotation)


def test_every_metric_the_docs_the_dashboard_and_the_alerts_name_is_served_by_the_running_operator(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """One job succeeds, one fails after a restart, one runs and reports progress the way the trainer
    does: every counter has a sample in this namespace and every per-job series one for these jobs. The
    names in docs/operations.md are exactly the served families; the chart's dashboard and alert rules query only
    served names; the per-job series say what the jobs' status says."""
    url = operator.metrics_url
    assert url is not None
    fine = trainingjob("fine", workers=1)
    doomed = trainingjob("doomed", workers=1, annotations={"sim.kubetrain.io/exit-code": "11"})
    doomed["spec"]["runPolicy"] = {"maxRestarts": 1}
    running = trainingjob("running", workers=2, annotations={"sim.kubetrain.io/hold": "true"})
    apply(cluster, namespace, fine, doomed, running)
    documented = documented_metrics()
    assert len(documented) >= 18, documented

    def explain() -> str:
        return f"operator log:\n{operator.log_tail()}"

    def phase(name: str) -> str | None:
        return phase_of(scrape(url), namespace, name)

    wait_for(lambda: phase("running") == "Running", "the held job Running", timeout=90, explain=explain)
    record = progress.progress_record(
        epoch=2, epochs=5, step=40, loss=0.5, accuracy=0.75, validation_loss=0.625, images_per_second=1500.0
    )
    report_progress(cluster, namespace, "running", record)
    wait_for(
        lambda: (
            of_job(scrape(url), namespace, "running").get("kubetrain_trainingjob_epoch") == 2.0
            and phase("fine") == "Succeeded"
            and phase("doomed") == "Failed"
        ),
        "the held job's progress (status.progress), one job Succeeded and one Failed",
        timeout=120,
        explain=explain,
    )
    samples = scrape(url)
    for counter in ("created", "succeeded", "failed", "restarted"):
        by_namespace = samples[f"kubetrain_trainingjobs_{counter}_total"]
        assert by_namespace.get((("namespace", namespace),), 0) >= 1, (counter, by_namespace)
    watched = of_job(samples, namespace, "running")
    since = watched.get("kubetrain_trainingjob_running_since_timestamp_seconds", 0.0)
    assert 0 < time.time() - since < 300, since
    assert phase_of(samples, namespace, "running") == "Running"
    assert watched == {
        "kubetrain_trainingjob_phase": 1.0,
        "kubetrain_trainingjob_restarts_total": 0.0,
        "kubetrain_trainingjob_epoch": 2.0,
        "kubetrain_trainingjob_step": 40.0,
        "kubetrain_trainingjob_training_loss": 0.5,
        "kubetrain_trainingjob_validation_loss": 0.625,
        "kubetrain_trainingjob_validation_accuracy": 0.75,
        "kubetrain_trainingjob_images_per_second": 1500.0,
        "kubetrain_trainingjob_progress_timestamp_seconds": datetime.fromisoformat(
            record["updatedAt"]
        ).timestamp(),
        "kubetrain_trainingjob_running_since_timestamp_seconds": since,
    }
    assert of_job(samples, namespace, "doomed") == {
        "kubetrain_trainingjob_phase": 1.0,
        "kubetrain_trainingjob_restarts_total": 1.0,
    }

    scraped = set(samples) | {name.removesuffix("_count") for name in samples if name.endswith("_count")}
    assert documented - scraped == set(), f"documented but not served: {sorted(documented - scraped)}"
    ours = {name for name in samples if name.startswith("kubetrain_") and not name.endswith("_created")}
    families = {re.sub(r"_(bucket|sum|count)$", "", name) for name in ours}
    assert families - documented == set(), f"served but not documented: {sorted(families - documented)}"

    queries = monitoring.dashboard_queries(monitoring.dashboard())
    queries += monitoring.rule_queries(monitoring.rendered_rule_groups(cluster.bin_dir / "helm"))
    queried = set().union(*(monitoring.metric_names(query) for query in queries))
    assert len(queried) >= 12, queried
    assert queried - set(samples) == set(), f"queried but not served: {sorted(queried - set(samples))}"


def test_a_deleted_jobs_series_leave_the_metrics_and_the_others_stay(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    url = operator.metrics_url
    assert url is not None
    held = {"sim.kubetrain.io/hold": "true"}
    apply(cluster, namespace, *(trainingjob(name, workers=1, annotations=held) for name in ("gone", "kept")))

    def explain() -> str:
        return f"operator log:\n{operator.log_tail()}"

    def series(name: str) -> dict[str, float]:
        return of_job(scrape(url), namespace, name)

    wait_for(
        lambda: (
            "kubetrain_trainingjob_phase" in series("gone")
            and "kubetrain_trainingjob_phase" in series("kept")
        ),
        "both jobs' phase in /metrics",
        timeout=90,
        explain=explain,
    )
    cluster.kubectl("-n", namespace, "delete", "trainingjob", "gone", "--wait=false")
    wait_for(
        lambda: not series("gone"), "the deleted job's series to leave /metrics", timeout=60, explain=explain
    )
    assert "kubetrain_trainingjob_phase" in series("kept")


def test_a_standby_serves_its_own_metrics_and_once_it_leads_the_same_port_serves_the_operators(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """A Ready standby is a target of the metrics Service: its port answers from the start, with the
    process's series and kubetrain_leader_election_leading 0 but nothing of the operator's (no cache, no
    per-job series, no counters beside the leader's). Once the Lease is released to it, the same port
    says it leads and serves the per-job series of the job in its namespace."""
    install_crd(cluster)  # as the session's operator does, which this test does not start
    lease = "kubetrain-standby-metrics"
    # Another replica holds the Lease and, as the standby sees it, for an hour: it stands by until released.
    held = {"holderIdentity": "another-replica", "leaseDurationSeconds": 3600}
    held["renewTime"] = held["acquireTime"] = leader.micro_time(datetime.now(UTC))
    cluster.apply(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": lease, "namespace": namespace},
            "spec": held,
        }
    )
    suspended = trainingjob("waiting", workers=1)
    suspended["spec"]["runPolicy"] = {"suspend": True}
    apply(cluster, namespace, suspended)
    standby = OperatorProcess(
        cluster,
        tmp_path / "standby.log",
        extra_args=(
            "--leader-elect",
            "--leader-election-namespace",
            namespace,
            "--leader-election-id",
            lease,
        ),
        env={"POD_NAME": "standby"},
        metrics_port=processes.free_port(),
        namespaces=(namespace,),
    )
    url = standby.metrics_url
    assert url is not None
    try:
        standby.start()  # returns once /healthz answers, which a standby does
        wait_for(
            lambda: "standing by" in standby.log_tail(), "the replica to stand by", explain=standby.log_tail
        )
        samples = scrape(url)
        assert samples["kubetrain_leader_election_leading"] == {(): 0.0}
        assert {name for name in samples if name.startswith("kubetrain_")} == {
            "kubetrain_leader_election_leading"
        }
        assert "process_start_time_seconds" in samples and "python_info" in samples, sorted(samples)

        cluster.kubectl(
            "-n", namespace, "patch", "lease", lease, "--type=merge", "-p", '{"spec":{"holderIdentity":null}}'
        )
        wait_for(
            lambda: phase_of(scrape(url), namespace, "waiting") == "Suspended",
            "the new leader's per-job series of the suspended job",
            timeout=90,
            explain=standby.log_tail,
        )
        samples = scrape(url)
        assert samples["kubetrain_leader_election_leading"] == {(): 1.0}
        assert of_job(samples, namespace, "waiting") == {
            "kubetrain_trainingjob_phase": 1.0,
            "kubetrain_trainingjob_restarts_total": 0.0,
        }
        assert "kubetrain_workqueue_depth" in samples and "process_start_time_seconds" in samples
    finally:
        standby.stop()
