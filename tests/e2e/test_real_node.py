"""End to end on a real node: the chart installs the operator from the image we build, and TrainingJobs run
the trainer image as real containers under the `restricted` Pod Security Standard.

Nothing is rewritten for the test: the operator runs in-cluster with its ServiceAccount token through the
`kubernetes` Service, workers find worker 0 by the headless Service's DNS name through CoreDNS, and rank 0
reports progress through the chart's worker ServiceAccount and admission policy.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from kubetrain_operator.api import constants
from kubetrain_operator.planning import observe
from kubetrain_trainer.checkpoints import parse_name
from testcluster import quickstart, workload
from testcluster.cluster import Cluster
from testcluster.node import Node
from testcluster.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.slow]

RELEASE_NAMESPACE = quickstart.RELEASE_NAMESPACE
WORKLOAD_NAMESPACE = workload.NAMESPACE
TRAINER_UID = quickstart.TRAINER_UID

INTERRUPTED_EPOCHS = 16
"""The length of a run a test interrupts just after its attempt's first checkpoint: long enough that the
interruption lands mid-training on a loaded machine. An epoch of the sample takes 1.4 s on 2 cores, and
with 6 epochs a resumed attempt once finished within the seconds a machine busy with background builds
took to notice it (the eviction then met a finished pod, and the job succeeded with one disruption, not
two)."""


def test_operator_pod_from_the_built_image_is_ready_live_and_serves_metrics(installed: Cluster) -> None:
    cluster = installed
    pods = json.loads(
        cluster.kubectl(
            "-n", RELEASE_NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/name=kubetrain", "-o", "json"
        )
    )["items"]
    assert len(pods) == 1, [pod["metadata"]["name"] for pod in pods]
    pod = pods[0]
    container = pod["spec"]["containers"][0]
    assert container["image"] == constants.OPERATOR_IMAGE
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] == 65532
    assert pod["status"]["containerStatuses"][0]["ready"] is True
    name = pod["metadata"]["name"]
    # The kubelet's readiness probe on /healthz made the container Ready; ask both endpoints
    # from inside the pod as well (exec through the kubelet and containerd's stream server).

    def answer(port: int, path: str) -> str | None:
        fetch = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/{path}').read().decode())"
        result = cluster.run_kubectl("-n", RELEASE_NAMESPACE, "exec", name, "--", "python3", "-c", fetch)
        return result.stdout if result.returncode == 0 else None

    healthz = wait_for(lambda: answer(8081, "healthz"), "the operator's liveness endpoint", 120, interval=2)
    assert healthz.strip(), "the liveness endpoint answers"
    metrics = wait_for(lambda: answer(8080, "metrics"), "the operator's metrics endpoint", 60, interval=2)
    assert "kubetrain_trainingjobs_created_total" in metrics and "kubetrain_workqueue_depth" in metrics


@pytest.mark.trains
def test_two_workers_find_each_other_by_dns_train_and_leave_artifacts(
    installed: Cluster, volumes: dict[str, Path]
) -> None:
    cluster = installed
    cluster.apply(workload.trainingjob("dns-ddp", epochs=3))

    def progress_shown() -> dict[str, str] | None:
        columns = workload.printed_columns(cluster, "dns-ddp")
        return columns if columns.get("EPOCH") and columns.get("TRAIN-LOSS") else None

    columns = wait_for(
        progress_shown,
        "EPOCH and TRAIN-LOSS in kubectl get tj",
        600,
        interval=1,
        explain=lambda: workload.story(cluster, "dns-ddp"),
    )
    assert columns["PHASE"] in {"Running", "Succeeded"}, columns
    status = workload.wait_phase(cluster, "dns-ddp", "Succeeded", 600)
    assert status["restarts"] == 0, status

    pod = json.loads(
        cluster.kubectl(
            "-n", WORKLOAD_NAMESPACE, "get", "pods", "-l", "kubetrain.io/job-name=dns-ddp", "-o", "json"
        )
    )["items"][0]
    env = {item["name"]: item.get("value") for item in pod["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == f"dns-ddp-r0-w0.dns-ddp.{WORKLOAD_NAMESPACE}.svc", env["MASTER_ADDR"]
    artifacts = volumes["output"] / "dns-ddp"
    for name in ("model.pt", "metrics.json", "loss_curve.png", "progress.json"):
        assert (artifacts / name).is_file(), (
            f"{name} missing in {sorted(p.name for p in artifacts.iterdir())}"
        )
    assert (artifacts / "model.pt").stat().st_uid == TRAINER_UID
    metrics = json.loads((artifacts / "metrics.json").read_text())
    assert len(metrics["epochs"]) == 3


def _wait_mid_training(cluster: Cluster, name: str, output: Path, attempt: int = 0) -> None:
    """Until attempt `attempt` has written a checkpoint of its own: its workers are training (the status's
    phase may lag behind), and a restart of it has a checkpoint to resume from."""
    checkpoints = output / name / "checkpoints"

    def mid_training() -> bool:
        keys = [parse_name(path.name) for path in checkpoints.glob("*.pt")] if checkpoints.is_dir() else []
        return any(key is not None and key.attempt == attempt for key in keys)

    wait_for(
        mid_training,
        f"{name} running attempt {attempt} with a checkpoint of its own",
        600,
        interval=0.5,
        explain=lambda: workload.story(cluster, name),
    )


@pytest.mark.trains
def test_a_killed_worker_restarts_the_group_once_and_it_resumes_from_the_checkpoint(
    real_cluster: tuple[Cluster, Node], installed: Cluster, volumes: dict[str, Path]
) -> None:
    cluster, node = real_cluster
    cluster.apply(workload.trainingjob("kill-ddp", epochs=INTERRUPTED_EPOCHS))
    _wait_mid_training(cluster, "kill-ddp", volumes["output"])
    os.kill(
        node.container_pid(WORKLOAD_NAMESPACE, workload.pod_of(cluster, "kill-ddp-r0-w1"), "worker"),
        signal.SIGKILL,
    )

    status = workload.wait_phase(cluster, "kill-ddp", "Succeeded", 900)
    assert status["restarts"] == 1, status
    jobs = cluster.kubectl(
        "-n", WORKLOAD_NAMESPACE, "get", "jobs", "-l", "kubetrain.io/job-name=kill-ddp", "-o", "name"
    )
    assert sorted(jobs.split()) == ["job.batch/kill-ddp-r1-w0", "job.batch/kill-ddp-r1-w1"], jobs
    # The trainer's line when it loads a checkpoint (components/resume.py); its "not resuming from
    # checkpoint ...; starting fresh" line, a fresh start, must not pass.
    log = cluster.kubectl("-n", WORKLOAD_NAMESPACE, "logs", "job/kill-ddp-r1-w0")
    assert re.search(
        rf"resumed from checkpoint \S+ in restart attempt 1: epoch \d+ of {INTERRUPTED_EPOCHS}", log
    ), log[-3000:]
    assert status["progress"]["resumedFrom"]["attempt"] == 1, status
    events = cluster.kubectl(
        "-n", WORKLOAD_NAMESPACE, "get", "events", "--field-selector", "involvedObject.name=kill-ddp"
    )
    assert "Restarting" in events, events


def _evict(cluster: Cluster, pod: str) -> None:
    """What `kubectl drain` does to each pod: an Eviction through the API (the API server marks the pod
    DisruptionTarget/EvictionByEvictionAPI and deletes it gracefully; the kubelet stops it with SIGTERM)."""
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod}}
    cluster.kubectl(
        "create",
        "--raw",
        f"/api/v1/namespaces/{WORKLOAD_NAMESPACE}/pods/{pod}/eviction",
        "-f",
        "-",
        input_text=json.dumps(eviction),
    )


@pytest.mark.trains
def test_drained_workers_restart_the_group_without_spending_a_restart(
    installed: Cluster, volumes: dict[str, Path]
) -> None:
    """maxRestarts 0: before, the first eviction failed the job (BackoffLimitExceeded counted as a
    crash). Two evictions, each in a different attempt, must cost no restart and the run must finish."""
    cluster = installed
    manifest = workload.trainingjob("drain-ddp", epochs=INTERRUPTED_EPOCHS)
    manifest["spec"]["runPolicy"] = {"maxRestarts": 0}
    cluster.apply(manifest)
    for attempt in (0, 1):
        _wait_mid_training(cluster, "drain-ddp", volumes["output"], attempt)
        _evict(cluster, workload.pod_of(cluster, f"drain-ddp-r{attempt}-w1"))

    status = workload.wait_phase(cluster, "drain-ddp", "Succeeded", 900)
    assert (status["restarts"], status["disruptionRestarts"]) == (0, 2), status
    assert status["lastFailure"]["disruption"] == "EvictionByEvictionAPI", status["lastFailure"]
    assert status["lastFailure"]["node"], status["lastFailure"]
    # The second eviction's record, whole: the Job controller deletes the evicted pod as soon as it has
    # failed its Job, so its name and reason come from the watch's last copy, never from the first one's.
    assert status["lastFailure"]["pod"].startswith("drain-ddp-r1-w1-"), status["lastFailure"]
    assert status["lastFailure"]["restartAttempt"] == 1, status["lastFailure"]
    assert status["restartAttempt"] == 2 and status["progress"]["resumedFrom"]["attempt"] == 2, status
    events = cluster.kubectl(
        "-n", WORKLOAD_NAMESPACE, "get", "events", "--field-selector", "involvedObject.name=drain-ddp"
    )
    assert "was evicted through the Eviction API" in events and "not counted against maxRestarts" in events


@pytest.mark.trains
def test_a_frozen_worker_is_caught_by_the_progress_deadline_and_the_group_restarts_naming_it(
    real_cluster: tuple[Cluster, Node], installed: Cluster, volumes: dict[str, Path]
) -> None:
    """Worker 1's trainer is frozen (SIGSTOP: a real process that stops making progress, its heartbeat
    thread with it); worker 0 then waits in its all-reduce for ever, as in a hung collective. No exit code
    ever comes: only failurePolicy.progressDeadlineSeconds ends the wait."""
    cluster, node = real_cluster
    manifest = workload.trainingjob("hang-ddp", epochs=INTERRUPTED_EPOCHS)
    manifest["spec"]["failurePolicy"] = {"progressDeadlineSeconds": 60}
    cluster.apply(manifest)
    _wait_mid_training(cluster, "hang-ddp", volumes["output"])
    assert workload.status(cluster, "hang-ddp")["restarts"] == 0, "a healthy group is never taken for hung"
    frozen = workload.pod_of(cluster, "hang-ddp-r0-w1")
    os.kill(node.container_pid(WORKLOAD_NAMESPACE, frozen, "worker"), signal.SIGSTOP)

    status = wait_for(
        lambda: (s := workload.status(cluster, "hang-ddp")).get("restarts") == 1 and s,
        "the stalled group to be restarted",
        300,
        interval=1,
        explain=lambda: workload.story(cluster, "hang-ddp"),
    )
    restarting = next(c for c in status["conditions"] if c["type"] == "Restarting")
    assert restarting["reason"] == "ProgressStalled", restarting
    assert f"worker 1 (pod {frozen}) at step" in restarting["message"], restarting
    assert "(failurePolicy.progressDeadlineSeconds)" in restarting["message"], restarting
    assert status["lastFailure"]["reason"] == "ProgressStalled", status["lastFailure"]

    done = workload.wait_phase(cluster, "hang-ddp", "Succeeded", 900)
    assert done["restarts"] == 1 and done["progress"]["resumedFrom"]["attempt"] == 1, done


@pytest.mark.trains
def test_a_resumed_group_waits_for_old_pods_on_a_node_whose_kubelet_stopped_and_starts_once_they_go(
    real_cluster: tuple[Cluster, Node], installed: Cluster, volumes: dict[str, Path]
) -> None:
    """The kubelet is stopped (SIGSTOP: the node goes silent, its containers keep running, as on a node
    cut off from the API server). The suspended group's pods stay Terminating past their grace period;
    the resumed job must not start a second group beside them however long that lasts (before, the
    operator gave up waiting 120 s after the old Jobs' deletion). Once the kubelet is back the pods go
    and the new attempt starts."""
    cluster, node = real_cluster
    cluster.apply(workload.trainingjob("cut-ddp", epochs=INTERRUPTED_EPOCHS))
    # Mid-training, not merely Running: pods the kubelet reported finished before it stopped would be
    # deleted at once, and nothing would be left to wait for.
    _wait_mid_training(cluster, "cut-ddp", volumes["output"])
    suspend = '{"spec":{"runPolicy":{"suspend":%s}}}'
    kubelet = node.pids["kubelet"]
    os.killpg(kubelet, signal.SIGSTOP)
    try:
        cluster.kubectl(
            "-n", WORKLOAD_NAMESPACE, "patch", "tj", "cut-ddp", "--type=merge", "-p", suspend % "true"
        )
        wait_for(
            lambda: workload.status(cluster, "cut-ddp").get("phase") == "Suspended",
            "cut-ddp to be suspended",
            120,
            explain=lambda: workload.story(cluster, "cut-ddp"),
        )
        cluster.kubectl(
            "-n", WORKLOAD_NAMESPACE, "patch", "tj", "cut-ddp", "--type=merge", "-p", suspend % "false"
        )

        def past_grace() -> str | None:
            message = workload.status(cluster, "cut-ddp").get("pendingMessage") or ""
            return message if "past its grace period" in message else None

        message = wait_for(past_grace, "the wait to say a pod is past its grace period", 180, interval=2)
        assert "cut-ddp-r0-w" in message and "kubectl delete pod" in message, message
        old_jobs = json.loads(
            cluster.kubectl(
                "-n", WORKLOAD_NAMESPACE, "get", "jobs", "-l", "kubetrain.io/job-name=cut-ddp", "-o", "json"
            )
        )["items"]
        deletions = [
            deleted.timestamp()
            for job in old_jobs
            if (deleted := observe.parse_time(job["metadata"].get("deletionTimestamp")))
        ]
        assert deletions, "the old Jobs stay (Foreground deletion) while their pods do"
        # Past the 120 s after the old Jobs' deletion at which the old planner started the next group anyway.
        time.sleep(max(0.0, max(deletions) + 130 - time.time()))
        status = workload.status(cluster, "cut-ddp")
        assert status["pendingReason"] == "WaitingForOldWorkers", status
        jobs = cluster.kubectl(
            "-n", WORKLOAD_NAMESPACE, "get", "jobs", "-l", "kubetrain.io/job-name=cut-ddp", "-o", "name"
        )
        assert "cut-ddp-r1-" not in jobs, jobs
    finally:
        os.killpg(kubelet, signal.SIGCONT)
    done = workload.wait_phase(cluster, "cut-ddp", "Succeeded", 900)
    assert (done["restartAttempt"], done["restarts"]) == (1, 0), done
