"""Elastic TrainingJobs (spec.elastic) on a real node: the chart's operator, the trainer image under torchrun
with the c10d rendezvous on the store pod `<job>-rdzv`, found through the headless Service and CoreDNS.

What kwok cannot show and this does: the store pod serves the rendezvous under the `restricted` Pod
Security Standard, every agent reaches it (and the others) by DNS, a lost worker's survivors really
re-rendezvous and train on in the same containers, and a replacement or an added worker joins them.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from testcluster import workload
from testcluster.cluster import Cluster
from testcluster.node import Node
from testcluster.waiting import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.cluster,
    pytest.mark.trains,
    pytest.mark.slow,
    pytest.mark.timeout(2400),
]

ELASTIC = {"minWorkers": 2, "maxWorkers": 3, "lastCallSeconds": 5}
EPOCHS = 40
"""An epoch of the sample takes about 2.5 s on 2 quiet cores (proportionally longer under load), so 40 leave
a kill or a scale, decided from the workers' logs a few seconds after an epoch ends, with most of the
training still ahead: time for a replacement's container to start and the new membership to train."""
EPOCH_DONE = re.compile(r"rank0 INFO epoch (\d+)/\d+ done:")
ACCURACY_TOLERANCE = 0.05
"""How far the scaled run's validation accuracy may be from a fixed-size run's (15 of the 300 validation
images). Both train with the global batch 192 from the same seeded batches, so they differ only by float
reduction order across world sizes and the steps replayed from a checkpoint after a re-rendezvous."""


def _elastic_job(name: str, *, workers: int) -> dict[str, Any]:
    job = workload.trainingjob(name, epochs=EPOCHS, workers=workers)
    job["spec"]["elastic"] = ELASTIC
    return job


def _worker_jobs(cluster: Cluster, name: str) -> dict[str, str]:
    """The TrainingJob's worker Jobs (not the store, not those being deleted): name -> uid."""
    items = workload.get(cluster, "jobs", "-l", f"kubetrain.io/job-name={name}")["items"]
    return {
        job["metadata"]["name"]: job["metadata"]["uid"]
        for job in items
        if job["metadata"]["labels"].get("kubetrain.io/role") != "rendezvous"
        and not job["metadata"].get("deletionTimestamp")
    }


def _pods_of(cluster: Cluster, job: str) -> list[dict[str, Any]]:
    return workload.get(cluster, "pods", "-l", f"job-name={job}")["items"]


def _log(cluster: Cluster, job: str) -> str:
    return cluster.kubectl("-n", workload.NAMESPACE, "logs", f"job/{job}", check=False)


def _world_sizes(*logs: str) -> list[int]:
    """The world size of every process group the job formed, in time order, from the workers' logs (only
    each round's rank 0 logs at INFO, and which worker that is changes), repeats of a size collapsed."""
    pattern = re.compile(r"^(\d\d:\d\d:\d\d) rank0 INFO joined process group: rank 0 of (\d+)", re.M)
    joins = sorted({(m.group(1), int(m.group(2))) for log in logs for m in pattern.finditer(log)})
    sizes = [size for _, size in joins]
    return [size for i, size in enumerate(sizes) if i == 0 or sizes[i - 1] != size]


def _events(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return workload.get(cluster, "events", "--field-selector", f"involvedObject.name={name}")["items"]


def _epochs_done(cluster: Cluster, name: str) -> int:
    """The last epoch the job finished, from its workers' logs: status.progress may be written up to 30 s
    later (the operator's status write rule), which is many epochs of this workload."""
    logs = [_log(cluster, job) for job in _worker_jobs(cluster, name)]
    return max((int(m.group(1)) for log in logs for m in EPOCH_DONE.finditer(log)), default=0)


def _training_at(cluster: Cluster, name: str, world_size: int, epoch: int) -> dict[str, Any]:
    """Wait until the job runs at `world_size` (status and `kubectl get` agree) with epoch `epoch` done."""

    def reached() -> dict[str, Any] | None:
        status = workload.status(cluster, name)
        if status.get("phase") in ("Failed", "Succeeded"):
            raise AssertionError(f"{name} ended before the test acted:\n{workload.story(cluster, name)}")
        if (
            status.get("phase") == "Running"
            and (status.get("elastic") or {}).get("worldSize") == world_size
            and workload.printed_columns(cluster, name).get("WORLD-SIZE") == str(world_size)
            and _epochs_done(cluster, name) >= epoch
        ):
            return status
        return None

    return wait_for(
        reached,
        f"{name} Running at world size {world_size} past epoch {epoch}",
        600,
        interval=2,
        explain=lambda: workload.story(cluster, name),
    )


def test_worker_0_killed_mid_training_is_replaced_alone_and_the_survivors_train_on(
    real_cluster: tuple[Cluster, Node], installed: Cluster, volumes: dict[str, Path]
) -> None:
    cluster, node = real_cluster
    cluster.apply(_elastic_job("elastic-kill", workers=3))
    _training_at(cluster, "elastic-kill", 3, epoch=2)
    before = _worker_jobs(cluster, "elastic-kill")
    assert sorted(before) == ["elastic-kill-r0-w0", "elastic-kill-r0-w1", "elastic-kill-r0-w2"], before

    # Worker 0: a fixed-size group's rendezvous host. SIGKILL to the container's first process (torchrun's
    # agent) ends the container, its training processes with it, as a lost node would.
    victim = workload.pod_of(cluster, "elastic-kill-r0-w0")
    first_rank0 = _log(cluster, "elastic-kill-r0-w0")  # its pod goes with its Job when it is replaced
    os.kill(node.container_pid(workload.NAMESPACE, victim, "worker"), signal.SIGKILL)

    status = workload.wait_phase(cluster, "elastic-kill", "Succeeded", 1200)
    story = workload.story(cluster, "elastic-kill")
    assert status["restarts"] == 1, story
    assert status["lastFailure"]["worker"] == 0 and status["lastFailure"]["exitCode"] == 137, status
    after = _worker_jobs(cluster, "elastic-kill")
    assert after == {
        "elastic-kill-r0-w1": before["elastic-kill-r0-w1"],
        "elastic-kill-r0-w2": before["elastic-kill-r0-w2"],
        "elastic-kill-r1-w0": after.get("elastic-kill-r1-w0"),
    }, f"only worker 0 was replaced: {after}\n{story}"
    logs = {job: _log(cluster, job) for job in after}
    for survivor in ("elastic-kill-r0-w1", "elastic-kill-r0-w2"):
        pods = _pods_of(cluster, survivor)
        assert len(pods) == 1, f"{survivor} kept its one pod: {[p['metadata']['name'] for p in pods]}"
        assert pods[0]["status"]["containerStatuses"][0]["restartCount"] == 0
        assert pods[0]["status"]["phase"] == "Succeeded", pods[0]["status"]
        # Its processes lost their peer and torchrun started them again, in the same container.
        assert "PEER_LOST" in logs[survivor], logs[survivor][-4000:]
    # The group formed at 3, and again at 3 once the replacement joined; that round resumed from the
    # checkpoint the group had written before the kill.
    sizes = _world_sizes(first_rank0, *logs.values())
    assert sizes[0] == 3 and sizes[-1] == 3, sizes
    resumed = re.compile(r"resumed from checkpoint \S+epoch-(\d{6})")
    resumed_epochs = [int(m.group(1)) for log in logs.values() for m in resumed.finditer(log)]
    assert resumed_epochs and max(resumed_epochs) >= 2, logs

    membership = [
        e["message"] for e in _events(cluster, "elastic-kill") if e["reason"] == "MembershipChanged"
    ]
    assert any("-> [1, 2]: world size 2" in m for m in membership), membership
    assert any("[1, 2] -> [0, 1, 2]: world size 3" in m for m in membership), membership
    reasons = {e["reason"] for e in _events(cluster, "elastic-kill")}
    assert "WorkerReplaced" in reasons and "Restarting" not in reasons, reasons
    assert (volumes["output"] / "elastic-kill" / "model.pt").is_file()


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (children first), read from /proc's children lists."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            out += [int(child), *_descendants(int(child))]
    return out


def test_a_hung_elastic_group_is_caught_by_the_progress_deadline_and_restarts_whole(
    real_cluster: tuple[Cluster, Node], installed: Cluster, volumes: dict[str, Path]
) -> None:
    """Worker 1's training processes are frozen (SIGSTOP) under a live torchrun agent, which sees nothing
    wrong: its children still exist. Worker 0 waits in its all-reduce for ever. Only the progress deadline
    ends it: the group restarts whole, with a new rendezvous store, and trains to the end."""
    cluster, node = real_cluster
    manifest = _elastic_job("elastic-hang", workers=2)
    manifest["spec"]["failurePolicy"] = {"progressDeadlineSeconds": 60}
    cluster.apply(manifest)
    _training_at(cluster, "elastic-hang", 2, epoch=2)
    assert workload.status(cluster, "elastic-hang")["restarts"] == 0, (
        "a healthy group is never taken for hung"
    )
    frozen = workload.pod_of(cluster, "elastic-hang-r0-w1")
    agent = node.container_pid(workload.NAMESPACE, frozen, "worker")
    trainers = _descendants(agent)
    assert trainers, f"torchrun (pid {agent}) has no training processes"
    for pid in trainers:
        os.kill(pid, signal.SIGSTOP)

    status = wait_for(
        lambda: (s := workload.status(cluster, "elastic-hang")).get("restarts") == 1 and s,
        "the hung elastic group to be restarted",
        300,
        interval=1,
        explain=lambda: workload.story(cluster, "elastic-hang"),
    )
    assert status["lastFailure"]["reason"] == "ProgressStalled", status["lastFailure"]
    assert f"(pod {frozen}) at step" in status["lastFailure"]["message"], status["lastFailure"]
    assert "with a new rendezvous store" in status["lastFailure"]["message"], status["lastFailure"]

    done = workload.wait_phase(cluster, "elastic-hang", "Succeeded", 1200)
    story = workload.story(cluster, "elastic-hang")
    assert done["restarts"] == 1 and done["restartAttempt"] == 1, story
    assert done["elastic"]["storeGeneration"] == 1, story
    assert sorted(_worker_jobs(cluster, "elastic-hang")) == ["elastic-hang-r1-w0", "elastic-hang-r1-w1"], (
        story
    )
    assert (volumes["output"] / "elastic-hang" / "model.pt").is_file()


def test_kubectl_scale_2_to_3_to_2_on_a_running_job_trains_as_well_as_a_fixed_size_run(
    installed: Cluster, volumes: dict[str, Path]
) -> None:
    cluster = installed
    cluster.apply(_elastic_job("elastic-scale", workers=2))
    _training_at(cluster, "elastic-scale", 2, epoch=1)
    before = _worker_jobs(cluster, "elastic-scale")
    assert sorted(before) == ["elastic-scale-r0-w0", "elastic-scale-r0-w1"], before

    cluster.kubectl("-n", workload.NAMESPACE, "scale", "tj/elastic-scale", "--replicas=3")
    _training_at(cluster, "elastic-scale", 3, epoch=0)
    added = sorted(set(_worker_jobs(cluster, "elastic-scale")) - set(before))
    assert added == ["elastic-scale-r0-w2"], added

    # torchrun forms a round of 3 once worker 2's agent waits; one epoch is trained by all three before
    # the scale-down. Worker 2's log is read now: it goes with its Job.
    def joined_at_three() -> list[str] | None:
        logs = [_log(cluster, job) for job in (*before, *added)]
        return logs if _world_sizes(*logs)[-1:] == [3] else None

    wait_for(
        joined_at_three,
        "a process group of 3 in the workers' logs",
        600,
        interval=5,
        explain=lambda: workload.story(cluster, "elastic-scale"),
    )
    epoch = _epochs_done(cluster, "elastic-scale")
    _training_at(cluster, "elastic-scale", 3, epoch=epoch + 1)
    at_three_logs = joined_at_three() or []

    cluster.kubectl("-n", workload.NAMESPACE, "scale", "tj/elastic-scale", "--replicas=2")
    status = workload.wait_phase(cluster, "elastic-scale", "Succeeded", 1200)
    story = workload.story(cluster, "elastic-scale")
    assert status["restarts"] == 0, story
    assert _worker_jobs(cluster, "elastic-scale") == before, f"workers 0 and 1 were never replaced:\n{story}"
    for worker in before:
        pods = _pods_of(cluster, worker)
        assert len(pods) == 1 and pods[0]["status"]["containerStatuses"][0]["restartCount"] == 0, worker
    sizes = _world_sizes(*at_three_logs, *(_log(cluster, worker) for worker in before))
    assert sizes == [2, 3, 2], sizes
    reasons = [e["reason"] for e in _events(cluster, "elastic-scale")]
    assert "ScaledDown" in reasons and "MembershipChanged" in reasons, reasons

    # The same epochs at a fixed size of 2 with the same global batch (96 x 2 = 64 x maxWorkers 3).
    fixed = workload.trainingjob("fixed-size", epochs=EPOCHS, workers=2)
    fixed["spec"]["trainer"]["batch_size"] = 96
    cluster.apply(fixed)
    workload.wait_phase(cluster, "fixed-size", "Succeeded", 1200)
    scaled = json.loads((volumes["output"] / "elastic-scale" / "metrics.json").read_text())["accuracy"]
    reference = json.loads((volumes["output"] / "fixed-size" / "metrics.json").read_text())["accuracy"]
    print(f"validation accuracy: scaled 2->3->2 {scaled:.4f}, fixed-size {reference:.4f}")
    assert scaled > 0.2, "better than chance (0.1): the scaled run learned"
    assert abs(scaled - reference) <= ACCURACY_TOLERANCE, (scaled, reference)
