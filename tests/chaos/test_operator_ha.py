"""Two operator replicas with leader election under load: the leader is frozen or killed mid-run.

The standby must take over, every TrainingJob must finish once, no child may be created twice, and a
frozen leader that wakes up must not write anything (the API server's audit log says who wrote what, by
the user agent that carries each replica's identity).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from chaos_support import StatusHistory, all_in_phase, statuses, submit, trainingjob, wait_until, writes_by
from kubetrain_operator.runtime import main
from testcluster.cluster import Cluster
from testcluster.operator_process import CreationCounter, OperatorProcess
from testcluster.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SEED = 20261203
WORKERS = 2
LEASE = "kubetrain-ha"
LEASE_SECONDS = 15
"""The operator's default lease duration: a standby waits this long after it last saw a renewal."""


@pytest.fixture
def replicas(
    chaos_cluster: Cluster, chaos_namespace: str, tmp_path: Path
) -> Iterator[Callable[[str], OperatorProcess]]:
    """Start `kubetrain operator --leader-elect` replicas named by POD_NAME, sharing one Lease."""
    started: list[OperatorProcess] = []

    def start(identity: str) -> OperatorProcess:
        process = OperatorProcess(
            chaos_cluster,
            tmp_path / f"{identity}.log",
            extra_args=(
                "--metrics-port", "0", "--resync-seconds", "2", "--leader-elect",
                "--leader-election-namespace", chaos_namespace, "--leader-election-id", LEASE,
            ),
            env={"POD_NAME": identity},
        )  # fmt: skip
        process.start(wait_live=False)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.running:
            os.killpg(process.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        process.stop()


def lease_spec(cluster: Cluster, namespace: str) -> dict:
    result = cluster.run_kubectl("-n", namespace, "get", "lease", LEASE, "-o", "json", "--request-timeout=5s")
    if result.returncode != 0:
        return {}
    return json.loads(result.stdout).get("spec") or {}


def holder(cluster: Cluster, namespace: str) -> str:
    return lease_spec(cluster, namespace).get("holderIdentity") or ""


def wait_for_holder(
    cluster: Cluster, namespace: str, identity: str, timeout: float, explain: Callable[[], str]
) -> float:
    """Seconds until `identity` holds the Lease."""
    started = time.monotonic()
    wait_for(
        lambda: holder(cluster, namespace) == identity,
        f"{identity} to hold the Lease",
        timeout,
        interval=0.2,
        explain=explain,
    )
    return time.monotonic() - started


def wait_for_takeover(
    cluster: Cluster, namespace: str, *, old: str, new: str, explain: Callable[[], str]
) -> tuple[float, float]:
    """Seconds until `new` holds the Lease that `old` held, and how long after `old`'s last renewal `new`
    acquired it by the Lease's own times (renewTime, acquireTime): both replicas run on this machine, so
    one wall clock wrote both, and the gap must be at least the lease duration however loaded it is."""
    started = time.monotonic()
    last_renewal: list[str] = []

    def taken_over() -> dict:
        spec = lease_spec(cluster, namespace)
        if spec.get("holderIdentity") == old:
            last_renewal[:] = [spec["renewTime"]]
        return spec if spec.get("holderIdentity") == new else {}

    spec = wait_for(taken_over, f"{new} to take the Lease over from {old}", 60, interval=0.2, explain=explain)
    took = time.monotonic() - started
    assert last_renewal, f"{old} was never seen holding the Lease: {spec}"
    gap = datetime.fromisoformat(spec["acquireTime"]) - datetime.fromisoformat(last_renewal[0])
    return took, gap.total_seconds()


def user_agent(identity: str) -> str:
    return f"({identity})"


def running_count(cluster: Cluster, namespace: str) -> int:
    return sum(s.get("phase") == "Running" for s in statuses(cluster, namespace).values())


def _jobs(prefix: str, count: int, rng: random.Random) -> list[dict]:
    return [
        trainingjob(
            f"{prefix}-{index:03d}",
            workers=WORKERS,
            annotations={"sim.kubetrain.io/run-for": f"{rng.randint(4, 15)}s"},
        )
        for index in range(count)
    ]


def _children(counter: CreationCounter, namespace: str, kind: str) -> int:
    return sum(1 for key in counter.created if key[0] == kind and key[1] == namespace)


def _assert_each_child_created_once_and_no_status_went_back(
    counter: CreationCounter, history: StatusHistory, namespace: str, names: list[str]
) -> None:
    """Whatever happened to the leaders: one Service and WORKERS Jobs per TrainingJob, each created once,
    and no status ever moved backwards."""
    assert not counter.duplicates(), counter.duplicates()
    assert _children(counter, namespace, "Job") == len(names) * WORKERS
    assert _children(counter, namespace, "Service") == len(names)
    assert not history.regressions(), history.regressions()


def test_a_frozen_leader_is_replaced_and_exits_on_waking_without_writing_anything(
    chaos_cluster: Cluster,
    chaos_namespace: str,
    replicas: Callable[[str], OperatorProcess],
    audit_log: Path,
) -> None:
    """SIGSTOP the leader while jobs are being created and run; the standby takes over once the Lease
    has stayed unrenewed for its duration. Then SIGCONT: the old leader's cache is stale by tens of
    seconds, and it must exit before its first write (not even its Lease is written again)."""
    rng = random.Random(SEED)
    counter = CreationCounter(chaos_cluster)
    counter.start()
    history = StatusHistory(chaos_cluster, chaos_namespace).start()
    leader_a = replicas("op-a")
    wait_for_holder(chaos_cluster, chaos_namespace, "op-a", 60, leader_a.log_tail)
    standby_b = replicas("op-b")
    wait_for(
        lambda: "standing by" in standby_b.log_tail(), "op-b to stand by", 60, explain=standby_b.log_tail
    )
    first, second = _jobs("frozen", 30, rng), _jobs("later", 10, rng)
    names = [job["metadata"]["name"] for job in first + second]
    try:
        submit(chaos_cluster, chaos_namespace, first)
        wait_until(
            lambda: running_count(chaos_cluster, chaos_namespace) >= 5, 120, "5 jobs Running", leader_a
        )
        os.killpg(leader_a.pid, signal.SIGSTOP)
        takeover, after_renewal = wait_for_takeover(
            chaos_cluster, chaos_namespace, old="op-a", new="op-b", explain=standby_b.log_tail
        )
        # While op-a sleeps, op-b creates the second batch's children and finishes jobs op-a saw run.
        submit(chaos_cluster, chaos_namespace, second)
        wait_until(
            lambda: all(statuses(chaos_cluster, chaos_namespace).get(n, {}).get("phase") for n in names),
            60,
            "op-b to pick up the second batch",
            standby_b,
        )
        thawed = datetime.now(UTC)
        os.killpg(leader_a.pid, signal.SIGCONT)
        exit_code = leader_a.wait(timeout=30)
        wait_until(
            all_in_phase(chaos_cluster, chaos_namespace, names, "Succeeded"),
            240,
            "every TrainingJob Succeeded under op-b",
            standby_b,
        )
    finally:
        counter.stop()
        history.stop()
    assert writes_by(audit_log, user_agent("op-b"), thawed), "the audit log shows op-b's writes"
    assert writes_by(audit_log, user_agent("op-a"), thawed) == []
    assert exit_code == main.LOST_LEASE_EXIT_CODE, leader_a.log_tail()
    # Never early: the standby took the Lease only once op-a's last renewal had stood for the lease.
    assert after_renewal >= LEASE_SECONDS, f"op-b acquired {after_renewal:.3f}s after op-a's last renewal"
    assert takeover < LEASE_SECONDS + 15, f"took over {takeover:.1f}s after the freeze"
    _assert_each_child_created_once_and_no_status_went_back(counter, history, chaos_namespace, names)
    current = statuses(chaos_cluster, chaos_namespace)
    assert {int(current[name].get("restarts") or 0) for name in names} == {0}


def test_a_killed_leader_is_replaced_once_its_lease_runs_out_and_no_child_is_created_twice(
    chaos_cluster: Cluster,
    chaos_namespace: str,
    replicas: Callable[[str], OperatorProcess],
) -> None:
    """SIGKILL the leader in the middle of a burst of creations: nothing is released, so the standby
    waits out the Lease, then finishes what the leader began, creating only what is missing."""
    rng = random.Random(SEED + 1)
    counter = CreationCounter(chaos_cluster)
    counter.start()
    history = StatusHistory(chaos_cluster, chaos_namespace).start()
    leader_a = replicas("op-a")
    wait_for_holder(chaos_cluster, chaos_namespace, "op-a", 60, leader_a.log_tail)
    standby_b = replicas("op-b")
    wait_for(
        lambda: "standing by" in standby_b.log_tail(), "op-b to stand by", 60, explain=standby_b.log_tail
    )
    jobs = _jobs("killed", 30, rng)
    names = [job["metadata"]["name"] for job in jobs]
    try:
        submit(chaos_cluster, chaos_namespace, jobs)
        wait_until(lambda: _children(counter, chaos_namespace, "Job") >= 10, 60, "children created", leader_a)
        leader_a.kill()
        takeover, after_renewal = wait_for_takeover(
            chaos_cluster, chaos_namespace, old="op-a", new="op-b", explain=standby_b.log_tail
        )
        wait_until(
            all_in_phase(chaos_cluster, chaos_namespace, names, "Succeeded"),
            240,
            "every TrainingJob Succeeded under op-b",
            standby_b,
        )
    finally:
        counter.stop()
        history.stop()
    assert after_renewal >= LEASE_SECONDS, f"op-b acquired {after_renewal:.3f}s after op-a's last renewal"
    assert takeover < LEASE_SECONDS + 15, f"op-b took over {takeover:.1f}s after the kill"
    _assert_each_child_created_once_and_no_status_went_back(counter, history, chaos_namespace, names)
    current = statuses(chaos_cluster, chaos_namespace)
    assert {int(current[name].get("restarts") or 0) for name in names} == {0}
