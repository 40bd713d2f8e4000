"""Kueue admits TrainingJobs as one unit: quota, queueing, preemption and Kueue's reasons, end to end.

An unmodified Kueue release (hack/build-kueue.sh) runs beside the control plane with TrainingJob in its
externalFrameworks; kwok plays the kubelet (tests/testcluster/kwok.yaml). The ClusterQueue's quota is 4
CPUs: one job of 4 workers at 1 CPU each.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kueue_support import FLAVOR_LABELS, FLAVOR_TOLERATION
from testcluster.cluster import Cluster
from testcluster.kueue import PODS_READY_TIMEOUT_SECONDS
from testcluster.manifests import trainingjob
from testcluster.operator_process import OperatorProcess
from testcluster.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _queued(name: str, *, workers: int = 4, run_for: str = "1s", **labels: str) -> dict[str, Any]:
    manifest = trainingjob(
        name,
        workers=workers,
        annotations={"sim.kubetrain.io/run-for": run_for},
        resources={"requests": {"cpu": "1"}},
    )
    manifest["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team", **labels}
    return manifest


class Jobs:
    """kubectl on one namespace, waiting with the operator's log as the explanation."""

    def __init__(self, cluster: Cluster, namespace: str, operator: OperatorProcess) -> None:
        self.cluster, self.namespace, self.operator = cluster, namespace, operator

    def apply(self, manifest: dict[str, Any]) -> None:
        self.cluster.kubectl("-n", self.namespace, "apply", "-f", "-", input_text=json.dumps(manifest))

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.cluster.kubectl("-n", self.namespace, "get", *args, "-o", "json"))

    def status(self, name: str) -> dict[str, Any]:
        return self.get("trainingjob", name).get("status") or {}

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 90) -> Any:
        return wait_for(
            predicate, what, timeout, explain=lambda: f"operator log:\n{self.operator.log_tail()}"
        )

    def wait_phase(self, name: str, phase: str, timeout: float = 90) -> dict[str, Any]:
        return self.wait(
            lambda: (s := self.status(name)).get("phase") == phase and s, f"{name} to be {phase}", timeout
        )

    def worker_jobs(self, name: str) -> list[dict[str, Any]]:
        return self.get("jobs", "-l", f"kubetrain.io/job-name={name}")["items"]

    def workload(self, name: str) -> dict[str, Any]:
        return self.get("workloads.kueue.x-k8s.io", name)

    def workload_if_any(self, name: str) -> dict[str, Any] | None:
        found = self.get("workloads.kueue.x-k8s.io", "--field-selector", f"metadata.name={name}")["items"]
        return found[0] if found else None


@pytest.fixture
def jobs(kueue_cluster: Cluster, queue_namespace: str, kueue_operator: OperatorProcess) -> Jobs:
    return Jobs(kueue_cluster, queue_namespace, kueue_operator)


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == type_), {})


def test_a_second_job_waits_suspended_while_the_first_holds_the_quota_then_runs(jobs: Jobs) -> None:
    jobs.apply(_queued("first", run_for="20s"))
    jobs.wait_phase("first", "Running")
    jobs.apply(_queued("second"))
    queued = jobs.wait(
        lambda: (
            (s := jobs.status("second")).get("phase") == "Suspended"
            and "queued in LocalQueue team" in s.get("message", "")
            and s
        ),
        "second to wait Suspended, saying it is queued",
    )
    assert _condition({"status": queued}, "Suspended")["reason"] == "Queued"
    assert jobs.status("first")["phase"] == "Running"
    assert jobs.worker_jobs("second") == []

    # One Workload for the whole group, admitted with the flavor's node labels and tolerations on every pod.
    [pod_set] = jobs.workload("first")["spec"]["podSets"]
    assert pod_set["count"] == 4
    pods = jobs.get("pods", "-l", "kubetrain.io/job-name=first")["items"]
    assert len(pods) == 4
    for pod in pods:
        assert FLAVOR_LABELS.items() <= pod["spec"]["nodeSelector"].items()
        assert FLAVOR_TOLERATION in pod["spec"]["tolerations"]
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "workers"

    jobs.wait_phase("first", "Succeeded", timeout=120)
    assert _condition(jobs.workload("first"), "Finished")["status"] == "True"
    jobs.wait_phase("second", "Succeeded", timeout=120)


def test_an_admitted_job_outlives_kueues_pods_ready_timeout_because_it_says_its_workers_are_ready(
    jobs: Jobs,
) -> None:
    """Kueue runs with waitForPodsReady: without the PodsReady condition every TrainingJob was evicted
    (PodsReadyTimeout) once the timeout passed, requeued, and evicted again."""
    jobs.apply(_queued("steady", run_for=f"{PODS_READY_TIMEOUT_SECONDS + 25}s"))
    jobs.wait_phase("steady", "Running")
    ready = jobs.wait(
        lambda: _condition(jobs.workload("steady"), "PodsReady").get("status") == "True",
        "the Workload to say its pods are ready",
    )
    assert _condition(jobs.workload("steady"), "PodsReady")["reason"] == "Started", ready
    jobs.wait_phase("steady", "Succeeded", timeout=PODS_READY_TIMEOUT_SECONDS + 90)
    workload = jobs.workload("steady")
    assert _condition(workload, "Evicted").get("status") != "True"
    assert _condition(jobs.get("trainingjob", "steady"), "Suspended").get("status") != "True"
    assert jobs.status("steady").get("restartAttempt", 0) == 0, "never evicted and resumed"


def test_removing_a_queued_jobs_queue_label_never_runs_it_outside_the_quota(jobs: Jobs) -> None:
    """Any tenant may edit their own TrainingJob: dropping the label must not skip the ClusterQueue."""
    jobs.apply(_queued("holder", run_for="60s"))
    jobs.wait_phase("holder", "Running")
    jobs.apply(_queued("waiter"))
    jobs.wait(
        lambda: "queued in LocalQueue team" in jobs.status("waiter").get("message", ""),
        "waiter to wait in the queue",
    )
    jobs.cluster.kubectl("-n", jobs.namespace, "label", "trainingjob", "waiter", "kueue.x-k8s.io/queue-name-")
    held = jobs.wait(
        lambda: "governs the job until it ends" in (s := jobs.status("waiter")).get("message", "") and s,
        "waiter to say its Workload still governs it",
        timeout=45,
    )
    assert held["phase"] == "Suspended"
    assert jobs.status("holder")["phase"] == "Running"
    assert jobs.worker_jobs("waiter") == []
    # Admitted once the holder's quota is free, the waiter runs (and ends) under its Workload.
    jobs.wait_phase("holder", "Succeeded", timeout=120)
    jobs.wait_phase("waiter", "Succeeded", timeout=120)
    assert _condition(jobs.workload("waiter"), "Finished")["status"] == "True"


def test_a_higher_priority_job_preempts_a_running_one_which_later_resumes_and_finishes(jobs: Jobs) -> None:
    jobs.apply(_queued("low", run_for="20s"))
    jobs.wait_phase("low", "Running")
    first_uid = jobs.worker_jobs("low")[0]["metadata"]["uid"]
    jobs.apply(_queued("high", run_for="2s", **{"kueue.x-k8s.io/priority-class": "urgent"}))
    high = jobs.wait(lambda: jobs.workload_if_any("high"), "the Workload of high")
    assert high["spec"]["priority"] == 1000
    evicted = jobs.wait(
        lambda: (
            (s := jobs.status("low")).get("phase") == "Suspended"
            and "Preempted" in s.get("message", "")
            and s
        ),
        "low to be suspended by Kueue's preemption",
    )
    assert "evicted by Kueue" in evicted["message"]
    jobs.wait_phase("high", "Succeeded", timeout=120)
    done = jobs.wait_phase("low", "Succeeded", timeout=180)
    # Resumed as a new attempt (its checkpoints keyed by the same job), not counted as a restart.
    assert done["restarts"] == 0 and done["restartAttempt"] >= 1
    assert all(j["metadata"]["uid"] != first_uid for j in jobs.worker_jobs("low"))
    reasons = {
        e["reason"] for e in jobs.get("events", "--field-selector", "involvedObject.name=low")["items"]
    }
    assert {"Evicted", "Admitted"} <= reasons


def test_a_job_asking_more_than_the_quota_stays_queued_with_kueues_reason_in_describe(jobs: Jobs) -> None:
    jobs.apply(_queued("too-big", workers=8))
    jobs.wait(
        lambda: "insufficient quota for cpu" in jobs.status("too-big").get("message", ""),
        "Kueue's reason in the TrainingJob's status",
    )
    described = jobs.cluster.kubectl("-n", jobs.namespace, "describe", "trainingjob", "too-big")
    assert "insufficient quota for cpu in flavor kwok-nodes" in described
    assert jobs.status("too-big")["phase"] == "Suspended"
    assert jobs.worker_jobs("too-big") == []


def test_suspending_a_running_queued_job_gives_its_quota_to_the_next_and_resuming_queues_it_again(
    jobs: Jobs,
) -> None:
    jobs.apply(_queued("held", run_for="20s"))
    jobs.wait_phase("held", "Running")
    jobs.apply(_queued("next", run_for="2s"))
    jobs.wait(lambda: jobs.status("next").get("phase") == "Suspended", "next to wait for the quota")
    suspend = '{"spec":{"runPolicy":{"suspend":%s}}}'
    jobs.cluster.kubectl("-n", jobs.namespace, "patch", "tj", "held", "--type=merge", "-p", suspend % "true")
    jobs.wait_phase("next", "Succeeded", timeout=120)
    assert jobs.workload("held")["spec"]["active"] is False
    assert jobs.status("held")["phase"] == "Suspended"
    jobs.cluster.kubectl("-n", jobs.namespace, "patch", "tj", "held", "--type=merge", "-p", suspend % "false")
    done = jobs.wait_phase("held", "Succeeded", timeout=180)
    assert done["restarts"] == 0 and done["restartAttempt"] >= 1


def test_the_example_queue_setup_and_trainingjob_are_accepted_by_kueue(jobs: Jobs) -> None:
    """examples/kueue/queues.yaml (what docs/kueue.md tells users to apply) passes Kueue's webhooks and CRD
    validation, and the queued example TrainingJob passes ours."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    for path in (examples / "kueue" / "queues.yaml", examples / "suspend-resume-queue.yaml"):
        result = jobs.cluster.run_kubectl("apply", "--dry-run=server", "-f", str(path))
        assert result.returncode == 0, f"{path}: {result.stderr}"


def test_an_elastic_job_is_admitted_at_the_size_it_was_scaled_to_in_the_queue_and_never_grows_past_it(
    jobs: Jobs,
) -> None:
    jobs.apply(_queued("blocker", run_for="600s"))
    jobs.wait_phase("blocker", "Running")
    elastic = _queued("stretchy", workers=2)
    elastic["spec"]["elastic"] = {"minWorkers": 2, "maxWorkers": 4}
    elastic["spec"]["podAnnotations"] = {"sim.kubetrain.io/hold": "true"}
    jobs.apply(elastic)
    jobs.wait(lambda: jobs.workload_if_any("stretchy"), "the Workload of stretchy")

    # Scaled while queued: the Workload asks for the new size, and Kueue admits that.
    jobs.cluster.kubectl("-n", jobs.namespace, "scale", "tj/stretchy", "--replicas=3")
    jobs.wait(
        lambda: jobs.workload("stretchy")["spec"]["podSets"][0]["count"] == 3,
        "the queued Workload to ask for 3 workers",
    )
    jobs.cluster.kubectl("-n", jobs.namespace, "delete", "tj", "blocker")
    jobs.wait_phase("stretchy", "Running", timeout=120)
    assignments = {
        a["name"]: a for a in jobs.workload("stretchy")["status"]["admission"]["podSetAssignments"]
    }
    assert (assignments["workers"]["count"], assignments["rendezvous"]["count"]) == (3, 1)
    # The store runs inside the admission too: on its assigned flavor's nodes, labelled with its pod set.
    store = jobs.get("jobs", "stretchy-rdzv")["spec"]["template"]["spec"]
    assert FLAVOR_LABELS.items() <= store["nodeSelector"].items(), store
    assert FLAVOR_TOLERATION in store["tolerations"], store
    store_labels = jobs.get("jobs", "stretchy-rdzv")["spec"]["template"]["metadata"]["labels"]
    assert store_labels["kueue.x-k8s.io/podset"] == "rendezvous", store_labels

    def workers() -> set[str]:
        return {
            j["metadata"]["name"]
            for j in jobs.worker_jobs("stretchy")
            if not j["metadata"].get("deletionTimestamp") and not j["metadata"]["name"].endswith("-rdzv")
        }

    jobs.wait(lambda: len(workers()) == 3, "3 workers")
    # Admitted: the Workload's pod sets are fixed, so a 4th worker would run outside the quota.
    jobs.cluster.kubectl("-n", jobs.namespace, "scale", "tj/stretchy", "--replicas=4")
    held = jobs.wait(
        lambda: "Kueue admitted 3 workers" in (s := jobs.status("stretchy")).get("message", "") and s,
        "stretchy to say it runs the 3 admitted workers",
    )
    assert held["phase"] == "Running" and len(workers()) == 3, held
    reasons = [
        e["reason"] for e in jobs.get("events", "--field-selector", "involvedObject.name=stretchy")["items"]
    ]
    assert "WorkersAboveAdmission" in reasons, reasons
    jobs.cluster.kubectl("-n", jobs.namespace, "scale", "tj/stretchy", "--replicas=2")
    jobs.wait(lambda: workers() == {"stretchy-r0-w0", "stretchy-r0-w1"}, "worker 2 removed by the scale-down")


def test_a_queued_jobs_node_selector_edit_reaches_its_workload_and_kueue_admits_the_new_one(
    jobs: Jobs,
) -> None:
    """Queued asking for nodes no flavor has, then edited to the flavor's nodes: before, the Workload kept
    the pod sets it was created with and Kueue never admitted the job (or, the other way round, admitted
    a node selector the workers no longer asked for)."""
    picky = _queued("picky", workers=1)
    # A tenth of a CPU: it fits beside what earlier tests' jobs still hold while their namespaces go.
    picky["spec"]["resources"] = {"requests": {"cpu": "100m"}}
    picky["spec"]["nodeSelector"] = {"kubetrain.io/test-pool": "elsewhere"}
    jobs.apply(picky)
    jobs.wait(
        lambda: "doesn't match node affinity" in jobs.status("picky").get("message", ""),
        "Kueue to refuse its flavor for the first node selector, said in the TrainingJob's status",
    )
    patch = json.dumps({"spec": {"nodeSelector": FLAVOR_LABELS}})
    jobs.cluster.kubectl("-n", jobs.namespace, "patch", "tj", "picky", "--type=merge", "-p", patch)
    jobs.wait(
        lambda: (
            jobs.workload("picky")["spec"]["podSets"][0]["template"]["spec"].get("nodeSelector")
            == FLAVOR_LABELS
        ),
        "the queued Workload to carry the new node selector",
    )
    jobs.wait_phase("picky", "Succeeded", timeout=300)
