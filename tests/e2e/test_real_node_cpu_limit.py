"""A worker's CPU limit sizes its threads, on a real node: the kubelet turns `resources.limits.cpu` into a
CFS quota that runc writes into the container's cgroup, and the trainer inside the container, whose
affinity mask is every core of the node, reads that quota and takes its thread count from it (issue 26:
a 2-CPU pod on a 64-core node ran 64 threads per rank and was throttled several-fold).

The node runs the cgroup v1 controllers with the cgroupfs driver; inside the container the `cpu` mount's
root is the container's own cgroup while /proc/self/cgroup names the full path, which is what the trainer
must see through.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from testcluster import workload
from testcluster.cluster import Cluster
from testcluster.node import Node, NodeError
from testcluster.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.slow, pytest.mark.trains]

NAMESPACE = workload.NAMESPACE
HOST_CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")
"""Where this machine kind mounts the v1 `cpu` controller (the node's cgroups live in the same tree)."""


def _host_quota(pid: int) -> tuple[int, int]:
    """(cfs_quota_us, cfs_period_us) of the cgroup that holds `pid` in the v1 `cpu` hierarchy: what runc
    wrote for the container's limit, read from outside."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            directory = HOST_CPU_CGROUPS / path.lstrip("/")
            quota = (directory / "cpu.cfs_quota_us").read_text()
            return int(quota), int((directory / "cpu.cfs_period_us").read_text())
    raise AssertionError(f"pid {pid} is in no cpu cgroup: {Path(f'/proc/{pid}/cgroup').read_text()}")


def test_a_one_cpu_limit_gives_one_thread_on_a_node_with_more_cores(
    real_cluster: tuple[Cluster, Node], installed: Cluster
) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("on a one-core machine a one-CPU limit and the cores give the same thread count")
    cluster, node = real_cluster
    manifest = workload.trainingjob("cpu-limit", epochs=2, workers=1)
    manifest["spec"]["resources"]["limits"]["cpu"] = "1"
    manifest["spec"]["trainer"]["cpu_threads"] = 0  # auto: the number under test
    cluster.apply(manifest)
    try:

        def worker_pid() -> int | None:
            """The worker container's host pid once it runs (importing torch alone takes seconds)."""
            pod = cluster.kubectl(
                "-n", NAMESPACE, "get", "pods", "-l", "job-name=cpu-limit-r0-w0", "-o", "name", check=False
            )
            try:
                return node.container_pid(NAMESPACE, pod.strip().removeprefix("pod/"), "worker")
            except NodeError:
                return None

        pid = wait_for(
            worker_pid,
            "the worker container running",
            600,
            interval=1,
            explain=lambda: workload.story(cluster, "cpu-limit"),
        )
        assert _host_quota(pid) == (100_000, 100_000), "runc wrote the one-CPU limit as the CFS quota"
        workload.wait_phase(cluster, "cpu-limit", "Succeeded", 600)
        log = cluster.kubectl("-n", NAMESPACE, "logs", "job/cpu-limit-r0-w0")
    finally:
        cluster.kubectl("-n", NAMESPACE, "delete", "tj", "cpu-limit", "--wait=false")
    assert "1 intra-op threads per process (cpu_threads auto)" in log, log[-3000:]
    capped = re.search(r"the cgroup CPU quota allows 1 of the (\d+) CPUs this process may run on", log)
    assert capped is not None, log[-3000:]
    assert int(capped.group(1)) >= 2, f"the container's affinity is the node's cores: {capped.group(0)}"
    assert log.count("the cgroup CPU quota allows") == 1, "said once, though threads and decoders ask"
