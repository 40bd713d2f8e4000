"""The heap trimmer gives glibc's kept free pages back: measured as RSS in a real process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from kubetrain_operator.runtime import heap

pytestmark = pytest.mark.unit

needs_glibc = pytest.mark.skipif(heap.find_malloc_trim() is None, reason="the C library has no malloc_trim")

# 1,500 blocks of 100 KiB (under glibc's 128 KiB mmap threshold, so they come from the heap), every page
# written; nine in ten are freed and the last stays, so the free space lies below a live block, where
# glibc never returns it on its own. Prints the anonymous RSS (KiB) after the frees, then, with a trimmer
# started or not, after 1 s.
FRAGMENTED_HEAP = """
import sys, time
from kubetrain_operator.runtime import heap

def anonymous_rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))

blocks = [b"x" * (100 * 1024) for _ in range(1500)]
kept = blocks[::10] + [blocks[-1]]
del blocks
print(anonymous_rss_kib())
trimmer = heap.HeapTrimmer(heap.find_malloc_trim(), interval=0.05)
if sys.argv[1] == "trim":
    assert trimmer.start()
time.sleep(1)
print(anonymous_rss_kib())
trimmer.stop()
"""


def _rss_before_and_after(mode: str) -> tuple[int, int]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FRAGMENTED_HEAP), mode],
        capture_output=True,
        text=True,
        timeout=60,
        env={"MALLOC_ARENA_MAX": "2", "PYTHONPATH": ":".join(sys.path)},
        check=True,
    )
    before, after = map(int, done.stdout.split())
    return before, after


@needs_glibc
def test_freed_memory_between_live_blocks_leaves_the_rss_once_the_trimmer_runs() -> None:
    before, after = _rss_before_and_after("trim")
    assert before - after > 100 * 1024, (before, after)  # of ~130 MiB freed


@needs_glibc
def test_without_the_trimmer_glibc_keeps_that_memory_resident() -> None:
    """The premise of the one above: without a trim, the freed space stays in the RSS."""
    before, after = _rss_before_and_after("keep")
    assert before - after < 10 * 1024, (before, after)


def test_a_c_library_without_malloc_trim_starts_no_thread() -> None:
    trimmer = heap.HeapTrimmer(None)  # what find_malloc_trim gives on musl or macOS
    assert trimmer.start() is False
    trimmer.stop()


def test_stopping_ends_the_thread_before_its_next_trim() -> None:
    calls: list[int] = []
    trimmer = heap.HeapTrimmer(lambda pad: calls.append(pad) or 1, interval=3600)
    assert trimmer.start()
    trimmer.stop()
    assert trimmer._thread is not None and not trimmer._thread.is_alive()
    assert calls == []
