"""An error raised on rank 0 alone makes every rank exit promptly with a retryable code (issue 26 defect 8),
instead of the others waiting for it in their next collective for `collective_timeout_seconds` (NCCL may
never notice a peer that left; its watchdog kills the waiting ranks after 30 minutes by default).

A real 2-process gloo group: rank 0's background checkpoint write fails after epoch 1, rank 0 learns it at
the next save while rank 1 waits for it in that save's collective, and rank 0 then lingers before leaving
the group (`failing_rank_worker.py`), as a process NCCL does not see go. And leaving the group ends the
watch's thread, which must not outlive the group in the store's wait.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from kubetrain_trainer.exit_codes import ExitCode
from kubetrain_trainer.peer_failure import PeerFailureWatch
from trainer_helpers import start_ranks, wait_all

WORKER = str(Path(__file__).with_name("failing_rank_worker.py"))
LINGER_SECONDS = 20.0
"""How long the failed rank 0 stays in the group: what the other rank would wait without being told."""
PROMPTLY_SECONDS = 10.0


@pytest.mark.distributed
@pytest.mark.trains
def test_a_failure_on_rank_0_alone_makes_the_other_rank_exit_peer_lost_at_once(tmp_path: Path) -> None:
    config = {
        "model": "simple_cnn",
        "epochs": 3,
        "batch_size": 16,
        "seed": 3,
        "cpu_threads": 1,
        "output_dir": str(tmp_path),
        "checkpoint_every_seconds": 0,
        "collective_timeout_seconds": 300,
        "data": {"dataset": "fake", "fake_size": 160, "validation_fraction": 0.2},
    }
    rank0, rank1 = start_ranks([WORKER], config, 2, "failing", TEST_LINGER_SECONDS=str(LINGER_SECONDS))
    try:
        rank1.wait(timeout=180)
        rank1_ended = time.time()
        rank0_still_in_the_group = rank0.poll() is None
    finally:
        (code0, out0), (code1, out1) = wait_all([rank0, rank1], timeout=120)

    leaving = re.search(r"LEAVING_AT (\d+\.\d+)", out0)
    assert leaving is not None, out0[-3000:]
    waited = rank1_ended - float(leaving.group(1))
    assert waited < PROMPTLY_SECONDS, f"rank 1 waited {waited:.1f}s for the failed rank 0\n{out1[-3000:]}"
    assert rank0_still_in_the_group, "rank 1 learnt of the failure from the announcement, not from an exit"
    assert code1 == ExitCode.PEER_LOST, out1[-3000:]
    assert "rank 0: OSError: [Errno 28] No space left on device" in out1
    assert code0 == ExitCode.UNEXPECTED_ERROR, out0[-3000:]  # rank 0's own failure keeps its own code
    assert "No space left on device (exit code 1, UNEXPECTED_ERROR)" in out0


@pytest.mark.unit
def test_leaving_the_group_ends_the_watch_thread_instead_of_leaving_it_blocked_in_the_store() -> None:
    # A thread still in the store's wait as the interpreter ended aborted the process now and then (exit
    # -6, "terminate called without an active exception") instead of letting it exit with its own code.
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30))
    watch = PeerFailureWatch(0, 1, store)
    time.sleep(0.5)  # the thread is in its wait
    watch.stop()
    assert "peer-failure-watch" not in [thread.name for thread in threading.enumerate()]


QUIET_WATCH = """
import sys
import time
from datetime import timedelta
import torch.distributed as dist
from kubetrain_trainer.peer_failure import PeerFailureWatch
store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30))
watch = PeerFailureWatch(0, 1, store)
time.sleep(float(sys.argv[1]))
watch.stop()
print("STOPPED", flush=True)
"""


@pytest.mark.distributed
@pytest.mark.slow
def test_a_watch_that_sees_no_failure_keeps_the_ranks_log_free_of_store_timeouts() -> None:
    # c10d prints two warnings ("waitForInput ... timed out") each time a store wait runs out; with a
    # 30 s wait, every rank of every run logged them twice a minute. 35 s outlasts that old wait.
    watched = subprocess.run(
        [sys.executable, "-c", QUIET_WATCH, "35"], capture_output=True, text=True, timeout=120, check=False
    )
    assert watched.returncode == 0 and "STOPPED" in watched.stdout, watched.stderr[-3000:]
    assert "waitForInput" not in watched.stderr and "timed out" not in watched.stderr, watched.stderr[-3000:]
