"""`kubetrain run --local` for a fixed-size group: the workers as processes, restarted whole as the
operator restarts them (`failure.decide`, shared with the operator), until its policies say the job
succeeded or failed."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from kubetrain_trainer import contract, termination

from kubetrain_operator import api
from kubetrain_operator.local.processes import (
    LOG_TAIL_LINES,
    STOP_GRACE_SECONDS,
    LocalResult,
    LocalWorker,
    free_port,
    plan_local_workers,
)
from kubetrain_operator.planning import failure
from kubetrain_operator.planning.observe import Worker


class Group:
    """The worker processes of one attempt, their log streams and their teardown."""

    def __init__(self, workers: list[LocalWorker], out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self.processes: list[subprocess.Popen[str]] = []
        self._streams: list[threading.Thread] = []
        self._tails = [collections.deque[str](maxlen=LOG_TAIL_LINES) for _ in workers]
        # Each worker's terminationMessagePath: an empty file, as the kubelet provides.
        self._records = tempfile.TemporaryDirectory(prefix="kubetrain-termination-")
        self.termination_logs = [Path(self._records.name) / f"worker-{w.index}" for w in workers]
        # The venv running us comes first on PATH, so `kubetrain` and `torchrun` resolve to its copies.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        for worker, termination_log in zip(workers, self.termination_logs, strict=True):
            termination_log.touch()
            process = subprocess.Popen(
                worker.argv,
                env={
                    **os.environ,
                    "PATH": path,
                    **worker.env,
                    contract.TERMINATION_LOG: str(termination_log),
                },
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
            self.processes.append(process)
            stream = threading.Thread(target=self._stream, args=(worker.index, process), daemon=True)
            stream.start()
            self._streams.append(stream)

    def _stream(self, index: int, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self._tails[index].append(line)
            with self._lock:
                self._out.write(f"[worker-{index}] {line}")
                self._out.flush()

    def signal_all(self, sig: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)

    def stop(self) -> None:
        """SIGTERM every live worker, SIGKILL what is left after the grace period, as the kubelet does."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while time.monotonic() < deadline and any(p.poll() is None for p in self.processes):
            time.sleep(0.1)
        self.signal_all(signal.SIGKILL)
        for process in self.processes:
            process.wait()
        for stream in self._streams:
            stream.join(timeout=5)

    def termination_message(self, index: int) -> str:
        """What the kubelet would report for worker `index`: its recorded exit, else its log's tail."""
        recorded = self.termination_logs[index].read_text(encoding="utf-8", errors="replace")
        return recorded or "".join(self._tails[index])

    def wait(self, attempt: int) -> list[Worker]:
        """Wait until every worker succeeded or one failed (then stop the rest), and report each one."""
        finished_at: dict[int, str] = {}
        while True:
            for index, process in enumerate(self.processes):
                if process.poll() is not None and index not in finished_at:
                    finished_at[index] = f"{time.time():020.6f}"
            if any(p.returncode not in (None, 0) for p in self.processes) or len(finished_at) == len(
                self.processes
            ):
                break
            time.sleep(0.1)
        failed_first = {i for i, p in enumerate(self.processes) if p.returncode not in (None, 0)}
        self.stop()
        # Workers stopped because another failed are reported as the operator saw them: still running.
        workers = []
        for index, process in enumerate(self.processes):
            code = process.returncode if process.returncode >= 0 else 128 - process.returncode
            workers.append(
                Worker(
                    index=index,
                    attempt=attempt,
                    phase="succeeded" if code == 0 else "failed" if index in failed_first else "running",
                    exit_code=termination.recorded_exit_code(code, self.termination_message(index)),
                    finished_at=finished_at.get(index),
                )
            )
        self._records.cleanup()
        return workers


def run_local(
    job: api.TrainingJob,
    directories: Mapping[str, Path],
    out: TextIO = sys.stdout,
    on_group: Callable[[Group], None] | None = None,
) -> LocalResult:
    """Run the job's workers here until the operator's policies say it succeeded or failed."""
    for directory in directories.values():
        directory.mkdir(parents=True, exist_ok=True)
    restarts = 0
    while True:
        workers = plan_local_workers(job, directories, master_port=free_port(), restart_attempt=restarts)
        out.write(f"kubetrain: starting {len(workers)} workers (attempt {restarts})\n")
        group = Group(workers, out)
        if on_group is not None:
            on_group(group)
        try:
            results = group.wait(restarts)
        except KeyboardInterrupt:
            group.stop()
            return LocalResult("Failed", "Interrupted", "interrupted; every worker was stopped", restarts)
        decision = failure.decide(job.spec, results, restarts)
        if decision.action == "restart":
            out.write(f"kubetrain: {decision.message}\n")
            restarts += 1
            continue
        phase = {"succeed": "Succeeded", "fail": "Failed"}.get(decision.action, "Failed")
        return LocalResult(phase, decision.reason, decision.message, restarts)
