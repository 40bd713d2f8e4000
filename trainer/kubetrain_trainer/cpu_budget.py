"""How many CPUs this process may use: its affinity, capped by the CPU quota of its cgroup.

A pod's `resources.limits.cpu` reaches the container as a CFS quota, not as a smaller CPU set: under
Kubernetes' default CPU manager the affinity mask holds every core of the node. Sized from the affinity
alone, a 2-CPU pod on a 64-core node would run 64 threads and 64 decoder processes per rank, throttled
several-fold. So the budget is min(affinity, ceil(quota / period)), read from either cgroup
version: v2's `cpu.max` ("max 100000": no limit) and v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1:
no limit) under the controller mounted with `cpu`; a hybrid host has both mounted and either may hold it.

A limit may sit on an ancestor (the kubelet sets one on the pod's cgroup too), so every level from the
process's cgroup up to the mount is read and the smallest wins. Where the hierarchy is mounted is read
from `mountinfo`: inside a container the mount's root is the container's own cgroup (v1, bind-mounted)
or the cgroup namespace makes it `/` (v2), while `/proc/self/cgroup` may still name the full path; the
path is taken relative to the mount's root, and a path outside it means the mount point is the
process's own cgroup. Anything unreadable or malformed counts as no limit: the affinity stays the answer.

Standard library only, like `config`: no torch, so anything may ask without importing it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)

PROC_SELF = Path("/proc/self")
"""Where `cgroup` (the process's cgroup paths) and `mountinfo` (where the hierarchies are mounted) live."""


@dataclass(frozen=True)
class _Hierarchy:
    """One cgroup hierarchy holding the CPU controller, as this process sees it."""

    version: int
    mount_point: Path
    mount_root: str
    """The hierarchy's path that is mounted at `mount_point` (`/`, or a container's own cgroup)."""
    cgroup: str
    """This process's cgroup in the hierarchy, as /proc/self/cgroup names it."""

    def own_directory(self) -> Path:
        """This process's cgroup directory under the mount, or the mount point when the path lies outside
        the mounted part (a container shown its own cgroup as the root)."""
        relative = _relative_to(self.cgroup, self.mount_root)
        return self.mount_point / relative if relative is not None else self.mount_point


def usable_cpus(proc_self: Path = PROC_SELF) -> int:
    """The CPUs this process may use: its affinity, capped by its cgroup CPU quota rounded up (1.5 -> 2).

    The first time a quota caps the affinity, one info line names both numbers."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = cgroup_limit(proc_self)
    if limit is None or limit >= affinity:
        return affinity
    _say_capped(limit, affinity)
    return limit


def cgroup_limit(proc_self: Path = PROC_SELF) -> int | None:
    """The smallest CPU quota, in whole CPUs rounded up, on this process's cgroup or any ancestor in any
    hierarchy with the CPU controller; None when none is set or nothing could be read."""
    limits = [
        limit
        for hierarchy in _cpu_hierarchies(proc_self)
        for directory in _up_to(hierarchy.own_directory(), hierarchy.mount_point)
        if (limit := _quota_in(directory, hierarchy.version)) is not None
    ]
    return min(limits, default=None)


@functools.cache
def _say_capped(limit: int, affinity: int) -> None:
    """Say so once per process (per pair of numbers), however many call sites ask for the budget."""
    log.info(
        "the cgroup CPU quota allows %d of the %d CPUs this process may run on: "
        "threads and decoder processes are sized to %d",
        limit,
        affinity,
        limit,
    )


def _cpu_hierarchies(proc_self: Path) -> list[_Hierarchy]:
    """The v2 hierarchy and the v1 hierarchy holding `cpu`, where both are mounted and named."""
    try:
        cgroup_lines = (proc_self / "cgroup").read_text().splitlines()
        mount_lines = (proc_self / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    v2_path, v1_path = None, None
    for line in cgroup_lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_path = path
    hierarchies = []
    for line in mount_lines:
        mount, separator, filesystem = line.partition(" - ")
        mount_fields, filesystem_fields = mount.split(), filesystem.split()
        if not separator or len(mount_fields) < 5 or len(filesystem_fields) < 3:
            continue
        fstype, options = filesystem_fields[0], filesystem_fields[2].split(",")
        root, mount_point = _unescape(mount_fields[3]), Path(_unescape(mount_fields[4]))
        if fstype == "cgroup2" and v2_path is not None:
            hierarchies.append(_Hierarchy(2, mount_point, root, v2_path))
        elif fstype == "cgroup" and "cpu" in options and v1_path is not None:
            hierarchies.append(_Hierarchy(1, mount_point, root, v1_path))
    return hierarchies


def _quota_in(directory: Path, version: int) -> int | None:
    """The CPU quota set on one cgroup directory, in whole CPUs rounded up; None when none or unreadable."""
    try:
        if version == 2:
            quota_text, _, period_text = (directory / "cpu.max").read_text().strip().partition(" ")
            if quota_text == "max":
                return None
        else:
            quota_text = (directory / "cpu.cfs_quota_us").read_text().strip()
            period_text = (directory / "cpu.cfs_period_us").read_text().strip()
        quota, period = int(quota_text), int(period_text)
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None
    return -(-quota // period)


def _up_to(directory: Path, top: Path) -> list[Path]:
    """`directory` and its parents up to `top` (inclusive): the levels whose limits bind this process."""
    levels = [directory]
    while directory != top and directory.is_relative_to(top):
        directory = directory.parent
        levels.append(directory)
    return levels


def _relative_to(path: str, root: str) -> str | None:
    """`path` relative to `root` in the cgroup hierarchy; None when it lies outside or climbs out (..)."""
    pure, base = PurePosixPath(path), PurePosixPath(root)
    if ".." in pure.parts or not pure.is_relative_to(base):
        return None
    return str(pure.relative_to(base))


def _unescape(field: str) -> str:
    """A mountinfo path with its octal escapes (`\\040` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)
