"""How a data set is held, decided before decoding any of it: in memory when its predicted peak fits the
memory a worker may ever have, else streamed from the decoded cache on disk.

In memory, every process holds the decoded set (uint8, N x 3 x S x S, once: the training and validation
parts are slices of one array) and, with `augment`, a reflect-padded copy of the training part. The
prediction is that plus the transient work buffers of each phase (preprocessing statistics, padding in
chunks, a batch) on top of what the process holds already when it decides (the Python interpreter and
torch, read from /proc/self/status), times the worker's processes: `tests/trainer/test_memory_peak.py`
holds it within 15 % of a real process's measured peak. A set whose in-memory peak exceeds the container's
memory limit (or, without one, the machine's memory) would be OOM-killed, exit 12, and retried until the
restart budget is spent; `data.cache: auto` streams it from disk instead (`decoded_cache`), where the
kernel holds the mapped pages in the page cache, once per node, and drops them under pressure. Only what
can never fit is refused (exit 3, before decoding). Memory in use by others is transient and not counted.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kubetrain_trainer.failures import DataError

CGROUP_ROOT = Path("/sys/fs/cgroup")
MEMINFO = Path("/proc/meminfo")
PROC_STATUS = Path("/proc/self/status")
_GIB = float(1 << 30)
_MIB = float(1 << 20)

WORK_ELEMENTS = 1 << 22
"""Elements per chunk of whole-set work (padding, preprocessing statistics), which bounds its buffers
(4 Mi float32 = 16 MiB) whatever the data set's size."""


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


MMAP_THRESHOLD = 1 << 20
"""Buffers from this size up are mapped by malloc on their own and returned to the system when freed."""


def return_freed_buffers() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD, so a freed work buffer or batch leaves the process.

    glibc raises the threshold to the size of each large buffer freed, after which buffers that size come
    from the heap and stay resident when freed: measured, preprocessing's 32 MiB chunks kept 163 MiB and an
    epoch of 128-px batches another 110 MiB beyond any prediction. Fixing it makes the peak what the data
    path holds (`DataBudget`). Returns whether it was set (not on a C library without mallopt).
    """
    import ctypes

    m_mmap_threshold = -3
    try:
        return bool(ctypes.CDLL(None).mallopt(m_mmap_threshold, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


def resident_bytes(status: Path = PROC_STATUS) -> int:
    """This process's resident memory now (VmRSS), 0 where the kernel does not say."""
    try:
        for line in status.read_text(encoding="utf-8").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def work_images(image_bytes: int) -> int:
    """Images per chunk of whole-set work: WORK_ELEMENTS worth, at least one."""
    return max(1, WORK_ELEMENTS // image_bytes)


@dataclasses.dataclass(frozen=True)
class DataBudget:
    """The memory a worker may use, what a process holds before the data, and how it will hold the data."""

    limit_bytes: int | None
    """memory_limit_bytes(); None: no known limit, everything fits."""
    processes: int
    """Processes on the worker (LOCAL_WORLD_SIZE): each holds its own copy in memory."""
    image_size: int
    augment: bool
    crop_padding: int = 4
    validation_fraction: float = 0.0
    batch_size: int = 64
    """Per process: a batch's buffers are part of the peak."""
    baseline_bytes: int = 0
    """What each process holds before the data (resident_bytes() when deciding)."""

    @property
    def image_bytes(self) -> int:
        return 3 * self.image_size**2

    @property
    def padded_image_bytes(self) -> int:
        return 3 * (self.image_size + 2 * self.crop_padding) ** 2

    def device_copy_bytes(self, train_images: int) -> int:
        """What a device copy of a training set holds: the images, int64 labels and, with augment, the
        padded copy the crops gather from."""
        padded = train_images * self.padded_image_bytes if self.augment else 0
        return train_images * (self.image_bytes + 8) + padded

    def _common(self, images: int) -> int:
        """What both paths hold besides images: int64 labels, an epoch's int64 order, alternating flips."""
        return 17 * images

    def _statistics_work(self) -> int:
        """Preprocessing statistics: one chunk as float64 and its squares."""
        return 2 * 8 * work_images(self.image_bytes) * self.image_bytes

    def _batch_work(self) -> int:
        """One batch: gathered (padded with augment) uint8, cropped uint8, normalised float32 twice (the
        normalised batch and its channels-last copy)."""
        padded = self.padded_image_bytes if self.augment else self.image_bytes
        return self.batch_size * (padded + self.image_bytes + 8 * self.image_bytes)

    def memory_peak(self, images: int, *, decoded_in_place: bool = True) -> int:
        """Predicted peak resident memory of one process holding `images` in memory, baseline included.

        `decoded_in_place`: an ImageFolder set is decoded (or read from its cache) into one array already
        in split order; FakeData and torchvision's CIFAR-10 arrays are copied once while loading and once
        more while splitting, so they peak at twice the set."""
        decoded = images * self.image_bytes
        train = images - round(images * self.validation_fraction)
        held = decoded + self._common(images)
        padded = train * self.padded_image_bytes if self.augment else 0
        chunk = work_images(self.image_bytes)
        pad_work = 4 * chunk * (self.image_bytes + self.padded_image_bytes) if self.augment else 0
        phases = [
            held if decoded_in_place else 2 * decoded,
            held + self._statistics_work(),
            held + padded + pad_work,
            held + padded + self._batch_work(),
        ]
        return self.baseline_bytes + max(phases)

    def disk_peak(self, images: int) -> int:
        """Predicted peak of one process streaming `images` from the mapped cache, not counting the mapped
        pages (the page cache's, shared by the node's processes and reclaimable): the baseline, labels and
        order, the statistics' work, and the batch being trained beside the one prefetched."""
        return (
            self.baseline_bytes + self._common(images) + max(self._statistics_work(), 2 * self._batch_work())
        )

    def choose(self, images: int, source: str, cache: str, *, streamable: bool) -> str:
        """ "memory" or "disk" for `data.cache` (auto, memory, disk), or a DataError naming every factor
        when the set cannot fit the worker's memory either way."""
        if cache == "disk":
            return "disk"
        in_memory = self.memory_peak(images, decoded_in_place=streamable) * self.processes
        if self.limit_bytes is None or in_memory <= self.limit_bytes:
            return "memory"
        if cache == "auto" and streamable:
            return "disk"
        per_process = in_memory / self.processes
        held = "decoded uint8" + (", plus a padded copy for augment" if self.augment else "")
        advice = (
            "set data.cache to auto or disk to stream it from the decoded cache on disk, "
            if streamable
            else ""
        )
        raise DataError(
            f"{source}: {images} images of 3x{self.image_size}x{self.image_size} held in memory need about "
            f"{per_process / _GIB:.1f} GiB per process ({held}, on top of the "
            f"{self.baseline_bytes / _MIB:.0f} MiB the process holds before the data) x LOCAL_WORLD_SIZE("
            f"{self.processes}) = "
            f"{in_memory / _GIB:.1f} GiB, more than the {self.limit_bytes / _GIB:.1f} GiB this worker may "
            f"use; {advice}lower data.image_size, use fewer images or processes per worker, or raise the "
            "workers' memory limit (resources.limits.memory)"
        )
