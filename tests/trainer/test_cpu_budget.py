"""The trainer sizes its threads and decoder processes from the CPUs the cgroup quota allows, not from
every core of the node: a pod's CPU limit is a CFS quota, and its affinity mask is the whole node.

Each case is a fake host: /proc/self/cgroup and /proc/self/mountinfo as the kernel writes them, and the
cgroup files under tmp_path where that mountinfo says the hierarchies are mounted. The affinity is 8.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubetrain_trainer import cpu_budget, decoding
from kubetrain_trainer.components import placement
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv

pytestmark = pytest.mark.unit

AFFINITY = 8
POD = "/kubepods/burstable/pod1"
CONTAINER = f"{POD}/ctr1"
V1_CGROUP = f"4:cpu,cpuacct:{CONTAINER}\n3:memory:{CONTAINER}\n0::/\n"
"""A v1 host's /proc/self/cgroup (the empty v2 line is there on hybrid hosts and harmless elsewhere)."""
V2_CGROUP = f"0::{CONTAINER}\n"


@dataclass
class Host:
    """A fake host: what /proc/self shows and which cgroup files hold what."""

    cgroup: str | None
    """/proc/self/cgroup; None when it cannot be read."""
    mounts: list[tuple[str, str, str, str]]
    """(fstype, super options, root in the hierarchy, mount point under tmp_path) per mountinfo line."""
    files: dict[str, str] = field(default_factory=dict)
    """Path under tmp_path -> content."""


def _v1(quota: str, period: str = "100000", at: str = CONTAINER) -> dict[str, str]:
    directory = f"sys/fs/cgroup/cpu,cpuacct{at}"
    return {f"{directory}/cpu.cfs_quota_us": quota, f"{directory}/cpu.cfs_period_us": period}


V1_MOUNTS = [
    ("cgroup", "rw,cpu,cpuacct", "/", "sys/fs/cgroup/cpu,cpuacct"),
    ("cgroup", "rw,memory", "/", "sys/fs/cgroup/memory"),
    ("cgroup", "rw,cpuset", "/", "sys/fs/cgroup/cpuset"),
]
V2_MOUNTS = [("cgroup2", "rw,nsdelegate", "/", "sys/fs/cgroup")]

CASES = {
    "v2 limit": (Host(V2_CGROUP, V2_MOUNTS, {f"sys/fs/cgroup{CONTAINER}/cpu.max": "200000 100000\n"}), 2),
    "v2 max is no limit": (
        Host(
            V2_CGROUP,
            V2_MOUNTS,
            {
                f"sys/fs/cgroup{CONTAINER}/cpu.max": "max 100000\n",
                f"sys/fs/cgroup{POD}/cpu.max": "max 100000\n",
            },
        ),
        AFFINITY,
    ),
    "v2 limit on an ancestor": (
        Host(
            V2_CGROUP,
            V2_MOUNTS,
            {
                f"sys/fs/cgroup{CONTAINER}/cpu.max": "max 100000\n",
                f"sys/fs/cgroup{POD}/cpu.max": "300000 100000\n",
            },
        ),
        3,
    ),
    "v2 fractional quota rounds up": (
        Host(V2_CGROUP, V2_MOUNTS, {f"sys/fs/cgroup{CONTAINER}/cpu.max": "150000 100000\n"}),
        2,
    ),
    "v2 quota below one CPU is one": (
        Host(V2_CGROUP, V2_MOUNTS, {f"sys/fs/cgroup{CONTAINER}/cpu.max": "20000 100000\n"}),
        1,
    ),
    "v2 cgroup namespace: the container is the root": (
        Host("0::/\n", V2_MOUNTS, {"sys/fs/cgroup/cpu.max": "100000 100000\n"}),
        1,
    ),
    "v1 limit": (Host(V1_CGROUP, V1_MOUNTS, _v1("300000")), 3),
    "v1 -1 is no limit": (Host(V1_CGROUP, V1_MOUNTS, _v1("-1")), AFFINITY),
    "v1 limit on an ancestor": (Host(V1_CGROUP, V1_MOUNTS, {**_v1("-1"), **_v1("250000", at=POD)}), 3),
    "v1 other period": (Host(V1_CGROUP, V1_MOUNTS, _v1("100000", period="50000")), 2),
    "v1 inside a container: its own cgroup mounted as the root": (
        Host(
            "4:cpu:" + CONTAINER + "\n",
            [("cgroup", "ro,cpu", CONTAINER, "sys/fs/cgroup/cpu")],
            {
                "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "100000\n",
                "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
            },
        ),
        1,
    ),
    "v1 cpu and cpuacct mounted apart": (
        Host(
            f"2:cpuacct:{CONTAINER}\n1:cpu:{CONTAINER}\n",
            [
                ("cgroup", "rw,cpuacct", "/", "sys/fs/cgroup/cpuacct"),
                ("cgroup", "rw,cpu", "/", "sys/fs/cgroup/cpu"),
            ],
            {
                f"sys/fs/cgroup/cpu{CONTAINER}/cpu.cfs_quota_us": "200000\n",
                f"sys/fs/cgroup/cpu{CONTAINER}/cpu.cfs_period_us": "100000\n",
            },
        ),
        2,
    ),
    "hybrid host: v1 cpu controller beside an empty v2 hierarchy": (
        Host(
            f"{V1_CGROUP}",
            [*V1_MOUNTS, ("cgroup2", "rw", "/", "sys/fs/cgroup/unified")],
            {**_v1("200000"), "sys/fs/cgroup/unified/cgroup.procs": ""},
        ),
        2,
    ),
    "mount point with a space (escaped in mountinfo)": (
        Host(
            V2_CGROUP,
            [("cgroup2", "rw", "/", "cgroup\\040v2")],
            {f"cgroup v2{CONTAINER}/cpu.max": "100000 100000"},
        ),
        1,
    ),
    "quota above the affinity": (
        Host(V2_CGROUP, V2_MOUNTS, {f"sys/fs/cgroup{CONTAINER}/cpu.max": "1600000 100000"}),
        AFFINITY,
    ),
    "unreadable /proc/self/cgroup": (
        Host(None, V2_MOUNTS, {f"sys/fs/cgroup{CONTAINER}/cpu.max": "100000 100000"}),
        AFFINITY,
    ),
    "malformed cpu.max": (
        Host(V2_CGROUP, V2_MOUNTS, {f"sys/fs/cgroup{CONTAINER}/cpu.max": "garbage\n"}),
        AFFINITY,
    ),
    "malformed v1 quota": (Host(V1_CGROUP, V1_MOUNTS, _v1("", period="")), AFFINITY),
    "no cgroup mounted": (Host(V2_CGROUP, [], {}), AFFINITY),
}


def _build(host: Host, root: Path) -> Path:
    """Write `host` under `root`; return its /proc/self."""
    proc_self = root / "proc" / "self"
    proc_self.mkdir(parents=True)
    if host.cgroup is not None:
        (proc_self / "cgroup").write_text(host.cgroup)
    lines = [
        f"{30 + index} 23 0:{40 + index} {hierarchy_root} {root}/{mount_point} rw,relatime - {fstype} {fstype} {options}"
        for index, (fstype, options, hierarchy_root, mount_point) in enumerate(host.mounts)
    ]
    (proc_self / "mountinfo").write_text("".join(f"{line}\n" for line in lines))
    for relative, content in host.files.items():
        path = root / relative.replace("\\040", " ")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return proc_self


@pytest.fixture(autouse=True)
def affinity_of_eight(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Eight CPUs in the affinity mask whatever this machine has, and the once-per-process line unsaid."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(AFFINITY)), raising=False)
    cpu_budget._say_capped.cache_clear()
    yield
    cpu_budget._say_capped.cache_clear()


@pytest.mark.parametrize(("host", "expected"), CASES.values(), ids=CASES.keys())
def test_usable_cpus_are_the_affinity_capped_by_the_cgroup_quota_rounded_up(
    host: Host, expected: int, tmp_path: Path
) -> None:
    assert cpu_budget.usable_cpus(_build(host, tmp_path)) == expected


def test_a_quota_below_the_affinity_is_said_once_per_process_naming_both_numbers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc_self = _build(CASES["v1 limit"][0], tmp_path)
    with caplog.at_level(logging.INFO, logger=cpu_budget.__name__):
        assert [cpu_budget.usable_cpus(proc_self) for _ in range(3)] == [3, 3, 3]
    assert [record.getMessage() for record in caplog.records] == [
        "the cgroup CPU quota allows 3 of the 8 CPUs this process may run on: "
        "threads and decoder processes are sized to 3"
    ]


def test_no_quota_says_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proc_self = _build(CASES["v1 -1 is no limit"][0], tmp_path)
    with caplog.at_level(logging.INFO, logger=cpu_budget.__name__):
        assert cpu_budget.usable_cpus(proc_self) == AFFINITY
    assert caplog.records == []


@pytest.mark.parametrize(
    ("configured", "local_world_size", "expected"), [(0, 1, 3), (0, 2, 1), (0, 4, 1), (5, 2, 5)]
)
def test_auto_cpu_threads_split_the_quota_among_a_workers_processes(
    configured: int, local_world_size: int, expected: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget is 3 CPUs under an affinity of 8: auto threads divide the 3, a configured count stays."""
    monkeypatch.setattr(cpu_budget, "cgroup_limit", lambda proc_self: 3)
    config = TrainerConfig(cpu_threads=configured)
    assert placement.cpu_threads(config, WorldEnv(local_world_size=local_world_size)) == expected


def test_decoding_starts_one_process_per_cpu_the_quota_allows(
    small_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[int] = []

    class CountingPool(ProcessPoolExecutor):
        def __init__(self, max_workers: int, **kwargs: object) -> None:
            started.append(max_workers)
            super().__init__(max_workers, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_budget, "cgroup_limit", lambda proc_self: 2)
    monkeypatch.setattr(decoding, "ProcessPoolExecutor", CountingPool)
    monkeypatch.setattr(decoding, "PARALLEL_FROM_FILES", 1)
    paths = sorted(p for class_dir in sorted(small_root.iterdir()) for p in class_dir.iterdir())
    assert sum(len(chunk) for chunk in decoding.decode_stream(paths, 32)) == len(paths)
    assert started == [2]
