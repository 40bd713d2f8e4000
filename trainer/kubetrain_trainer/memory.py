"""Whether a data set can fit in the memory a worker may ever have, decided before decoding any of it.

Every process holds the whole decoded data set (uint8, N x 3 x S x S), twice while it is split into the
training and validation parts, plus a padded copy of the training part when `augment` is on. A data set
whose copies exceed the container's memory limit (or, without one, the machine's memory) would end in an
out-of-memory kill, exit 12, retried until the restart budget is spent; the limit is part of the pod spec,
so no retry can help: it is a data error (exit 3) named before the first image is decoded.
Memory in use by others is transient and is not counted: only what can never fit is refused.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kubetrain_trainer.failures import DataError

CGROUP_ROOT = Path("/sys/fs/cgroup")
MEMINFO = Path("/proc/meminfo")
_GIB = float(1 << 30)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):  # missing, or "max" (cgroup v2 without a limit)
        return None


def _mem_total(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_limit_bytes(cgroup_root: Path = CGROUP_ROOT, meminfo: Path = MEMINFO) -> int | None:
    """The container's memory limit (cgroup v2 or v1), else the machine's total memory; None if unknown.

    cgroup v1 reports "no limit" as a number near 2**63, so a limit above the machine's memory is none.
    """
    total = _mem_total(meminfo)
    limits = [
        limit
        for limit in (
            _read_int(cgroup_root / "memory.max"),
            _read_int(cgroup_root / "memory" / "memory.limit_in_bytes"),
        )
        if limit is not None and (total is None or limit < total)
    ]
    return min(limits) if limits else total


@dataclasses.dataclass(frozen=True)
class DataBudget:
    """The memory a worker may use and how its processes will hold a data set."""

    limit_bytes: int | None
    """memory_limit_bytes(); None skips the check."""
    processes: int
    """Processes on the worker (LOCAL_WORLD_SIZE), each holding its own copy."""
    image_size: int
    augment: bool

    def bytes_per_process(self, images: int) -> int:
        """Peak host memory for the data in one process: decoded twice, plus padded crops when augmenting."""
        decoded = images * 3 * self.image_size**2
        padded = images * 3 * (self.image_size + 2 * 4) ** 2 if self.augment else 0
        return 2 * decoded + padded

    def check(self, images: int, source: str) -> None:
        """Raise DataError naming every factor when the data set cannot fit the worker's memory."""
        if self.limit_bytes is None:
            return
        per_process = self.bytes_per_process(images)
        needed = per_process * self.processes
        if needed <= self.limit_bytes:
            return
        raise DataError(
            f"{source}: {images} images of 3x{self.image_size}x{self.image_size} need about "
            f"{per_process / _GIB:.1f} GiB per process (decoded uint8, held twice while splitting"
            f"{', plus padded copies for augment' if self.augment else ''}) x LOCAL_WORLD_SIZE("
            f"{self.processes}) = {needed / _GIB:.1f} GiB, more than the {self.limit_bytes / _GIB:.1f} GiB "
            "this worker may use; lower data.image_size, use fewer images or processes per worker, or "
            "raise the workers' memory limit (resources.limits.memory)"
        )
