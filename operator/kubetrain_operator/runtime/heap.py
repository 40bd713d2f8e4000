"""Giving the C allocator's free memory back to the system, once a minute.

Why: glibc's malloc keeps what the operator frees. Watch lines and API answers of a few to tens of KiB
come and go thousands of times an hour, and the free space they leave between longer-lived blocks stays
resident: glibc returns memory on its own only from the top of its heap. An hour of churn showed it
(benchmarks/results/operator-soak.md, runs 6 and 7): with Python's heap flat, glibc's free-but-kept bytes
grew 6.9 MB an hour, and without trimming the RSS grew 8.7 MB an hour (2.97 with it). A container's
memory limit counts those pages all the same. `malloc_trim(0)` releases every free page wherever it lies
(madvise MADV_DONTNEED), so the RSS follows what is in use; a call took 0.38 ms in that hour.

Where the C library has no `malloc_trim` (musl, macOS), there is nothing to do and no thread starts.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable

logger = logging.getLogger("kubetrain.operator")

TRIM_INTERVAL_SECONDS = 60.0
"""Between two trims: often enough that a burst's garbage is not kept for long, rarely enough that the
pages taken back are not wanted again at once."""


def find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim` from the process's own C library, or None where it has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """A daemon thread that calls `trim(0)` (`find_malloc_trim`) every `interval` seconds until stopped."""

    def __init__(self, trim: Callable[[int], int] | None, interval: float = TRIM_INTERVAL_SECONDS) -> None:
        self.interval = interval
        self._trim = trim
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start trimming; False where the C library cannot trim."""
        if self._trim is None:
            logger.debug("the C library has no malloc_trim: freed memory stays with the allocator")
            return False
        self._thread = threading.Thread(
            target=self._run, args=(self._trim,), name="kubetrain-heap-trim", daemon=True
        )
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, trim: Callable[[int], int]) -> None:
        while not self._stopped.wait(self.interval):
            trim(0)
