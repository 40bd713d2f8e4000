"""A rank that fails tells the others, so they leave the group at once instead of waiting for it.

An error raised on one rank alone (rank 0's background checkpoint write, its choice of a checkpoint to
resume) leaves the other ranks in their next collective. gloo notices when the failed process closes its
sockets, but NCCL may not notice at all: the others then wait out `collective_timeout_seconds` (30 minutes
by default) until the watchdog kills them, and the group's restart waits with them. So the failing rank
writes why into the group's rendezvous store (`announce`) before it leaves, and every rank keeps a thread
blocked on that key (`PeerFailureWatch`): when another rank's announcement arrives, it aborts this rank's
process group, which makes an NCCL collective the main thread is in (or reaches next) raise, and the
trainer exits with PEER_LOST (11, retryable) naming the rank that failed first. A collective the abort
does not end (gloo's wait for a peer's data goes on) is left by ending the process from the watch
thread, with the same code and record, once the main thread has had `LEAVE_SECONDS` to leave the group.

Only an announcement counts: a store that goes away (rank 0, its host, ended) is what every run's end
looks like from a slower rank, and a rank killed outright announces nothing; the collectives report those.

A store's wait ends only when every key it names is set, so each rank's thread waits on a wake key of its
own: an announcement sets the failure and then every rank's wake key, and leaving the group sets this rank's
and joins the thread. The thread must be gone before the interpreter ends: a daemon thread still in the
store's C++ calls when the interpreter finalizes (reading this rank's own announcement, or in a wait that
fails as rank 0's store server is freed) is ended by CPython on its way back into Python, through C++
frames that may not unwind, and the process aborts ("terminate called without an active exception",
exit -6) instead of exiting with its own code.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from kubetrain_trainer import contract, termination
from kubetrain_trainer.exit_codes import ExitCode

if TYPE_CHECKING:
    import torch.distributed as dist

log = logging.getLogger(__name__)

FAILURE_KEY = "kubetrain/failed"
"""The store key a failing rank sets to `rank R: <what failed>`; the default store is scoped to one process
group (and under torchrun to one restart of the workers), so an earlier group's failure is never seen."""

WAKE_KEY_PREFIX = "kubetrain/wake/"
"""Rank R's watch waits on `kubetrain/wake/R`, set by an announcement (for every rank) or by R leaving."""

WAIT_SECONDS = 3600.0
"""How long one blocking wait lasts before the watch waits again. A wake is never lost (a key set before
the wait begins ends it at once), so this bound is only a backstop, and a long one: every wait that runs
out makes c10d print two warnings ("waitForInput ... timed out"), which at 30 s filled every rank's log
twice a minute."""

JOIN_SECONDS = 5.0
"""How long leaving the group waits for the woken thread (a store that is gone has ended it already)."""

LEAVE_SECONDS = 3.0
"""How long the main thread has, after the abort, to leave the group through its own failure path (which
finishes a checkpoint write in flight) before the watch ends the process."""


class PeerFailureWatch:
    """This rank's watch for another rank's failure, and its own announcement of one."""

    def __init__(self, rank: int, world_size: int, store: dist.Store) -> None:
        """Start watching `store` (the group's default store) from a daemon thread on a connection of its own:
        a blocking wait holds its connection, and the group's own requests must not queue behind it."""
        self.rank = rank
        self.world_size = world_size
        self.failure: str | None = None
        """Another rank's announcement once seen: why this rank left the group."""
        self._store = store
        self._watched = store.clone()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="peer-failure-watch", daemon=True)
        self._thread.start()

    def announce(self, reason: str) -> None:
        """Tell the other ranks that this one failed (`reason`), before it leaves the group; never raises,
        since the failure being reported matters more than this report of it."""
        if self.failure is not None:  # this rank is leaving because of another's announcement
            return
        try:
            self._store.set(FAILURE_KEY, f"rank {self.rank}: {reason}")
            wake_keys = [_wake_key(rank) for rank in range(self.world_size)]
            self._store.multi_set(wake_keys, [b""] * self.world_size)
        except Exception as error:
            log.warning("could not tell the other ranks that rank %d failed: %s", self.rank, error)

    def stop(self) -> None:
        """Stop acting on announcements, and end the thread: the group is being left."""
        self._stopped.set()
        try:
            self._store.set(_wake_key(self.rank), b"")
        except Exception as error:  # the store is gone (its host ended), and the thread's wait with it
            log.debug("could not wake the peer failure watch: %s", error)
        self._thread.join(JOIN_SECONDS)
        if self._thread.is_alive():
            log.warning("the peer failure watch did not end within %.0fs of leaving the group", JOIN_SECONDS)

    def _watch(self) -> None:
        import torch.distributed as dist

        while not self._stopped.is_set():
            started = time.monotonic()
            try:
                self._watched.wait([_wake_key(self.rank)], timedelta(seconds=WAIT_SECONDS))
                break  # woken: by an announcement, or by this rank leaving the group (`_stopped` says)
            except dist.DistStoreError:  # the wait timed out: nobody failed yet
                if time.monotonic() - started < WAIT_SECONDS / 2:
                    time.sleep(1.0)  # an error other than the timeout: do not spin on it
            except Exception as error:  # the store is gone (its host ended): the run is over for this watch
                log.debug("peer failure watch ended: %s", error)
                return
        if self._stopped.is_set():
            return
        try:
            announced = self._watched.get(FAILURE_KEY).decode(errors="replace")
        except Exception as error:
            log.debug("peer failure watch could not read the announcement: %s", error)
            return
        if announced.startswith(f"rank {self.rank}:"):
            return
        self.failure = announced
        log.error("%s; leaving the group instead of waiting for it in the next collective", announced)
        _abort_group()
        if not self._stopped.wait(LEAVE_SECONDS):  # the main thread is still in a collective
            _exit_peer_lost(f"{announced} (this rank left the group from a collective that waited for it)")


def _wake_key(rank: int) -> str:
    return f"{WAKE_KEY_PREFIX}{rank}"


def _abort_group() -> None:
    """Abort this process's default process group: every collective in flight or started later raises, in
    whatever thread it runs (torch's own watchdog does the same after the collective timeout; torch is
    pinned, so the private function is there)."""
    from torch.distributed import distributed_c10d

    distributed_c10d._abort_process_group()


def _exit_peer_lost(message: str) -> None:
    """End the process now with PEER_LOST, recorded where the kubelet reads it (as `cli` records a failure):
    the main thread is blocked in a collective and cannot raise."""
    code = ExitCode.PEER_LOST
    log.error("%s (exit code %d, %s)", message, code, code.name)
    record_path = os.environ.get(contract.TERMINATION_LOG)
    if record_path:
        termination.write_record(Path(record_path), termination.ExitRecord(int(code), code.name, message))
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))
