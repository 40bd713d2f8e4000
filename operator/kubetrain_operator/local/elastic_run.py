"""`kubetrain run --local` for an elastic TrainingJob (spec.elastic): elasticity without a cluster.

The same pieces as on a cluster, as local processes: the rendezvous store runs as a process of its own
(`python -m kubetrain_trainer.rendezvous_store`, the store pod's program), and each worker is its pod's
container rendered by the operator's builders (torchrun with the c10d rendezvous), the endpoint moved to
127.0.0.1. The membership policy is the operator's (`elastic_group.decide_failure`): a worker that fails with
a retryable code is replaced alone, as a new attempt, while the others re-rendezvous; a non-retryable
code or a spent budget fails the run. Editing spec.workers in the manifest while it runs is the local
`kubectl scale`: workers are added or removed (highest index first) without touching the others.
A store process that dies is what a lost store pod is on a cluster (`elastic_group.decide_rendezvous_loss`):
a fresh store cannot rebuild the rendezvous, so every worker is stopped and the group starts again, a new
store and every worker at a new attempt, resuming from the checkpoints; it counts as one restart.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

import yaml
from kubetrain_trainer import contract, termination

from kubetrain_operator import api
from kubetrain_operator.local import processes
from kubetrain_operator.planning import builders, elastic_group
from kubetrain_operator.planning.observe import Worker

STORE_START_SECONDS = 60.0
"""How long the store process may take to listen (importing torch on a loaded laptop takes seconds)."""
POLL_SECONDS = 0.2


@dataclasses.dataclass
class Member:
    """One running worker process: its index, attempt, process and what the kubelet would keep of it."""

    index: int
    attempt: int
    process: subprocess.Popen[str]
    termination_log: Path
    tail: collections.deque[str]
    stream: threading.Thread

    pod_name: str

    def signal(self, sig: int) -> None:
        """Signal the whole worker, as a container's end reaches every process in its cgroup: torchrun's
        agent and the trainer processes it starts in sessions of their own."""
        for pid in {self.process.pid, *_container_pids(self.pod_name)}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if pid == self.process.pid:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)

    def termination_message(self) -> str:
        recorded = self.termination_log.read_text(encoding="utf-8", errors="replace")
        return recorded or "".join(self.tail)


def _container_pids(pod_name: str) -> list[int]:
    """The processes whose environment names this worker's pod (KUBETRAIN_POD_NAME, unique per worker
    and attempt): locally, the environment is what a pod's cgroup is, the one handle on processes that
    left the agent's process group. Empty where there is no /proc."""
    marker = f"{contract.POD_NAME}={pod_name}".encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
    return pids


def manifest_workers(path: Path, spec: api.TrainingJobSpec) -> Callable[[], int]:
    """spec.workers as the manifest says now: the local `kubectl scale`. A value the schema would refuse
    (outside minWorkers..maxWorkers), or a file caught mid-save, keeps the last good value."""
    last = spec.workers

    def read() -> int:
        nonlocal last
        assert spec.elastic is not None
        with contextlib.suppress(OSError, yaml.YAMLError, TypeError, KeyError):
            workers = yaml.safe_load(path.read_text())["spec"]["workers"]
            if isinstance(workers, int) and spec.elastic.min_workers <= workers <= spec.elastic.max_workers:
                last = workers
        return last

    return read


class ElasticRun:
    """The store process and the worker processes of one local elastic run."""

    def __init__(self, job: api.TrainingJob, directories: Mapping[str, Path], out: TextIO) -> None:
        self.job = job
        self.directories = directories
        self.out = out
        self.members: dict[int, Member] = {}
        self._lock = threading.Lock()
        self._records = tempfile.TemporaryDirectory(prefix="kubetrain-termination-")
        # The venv running us comes first on PATH, so `kubetrain` and `torchrun` resolve to its copies.
        self._path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.port = 0
        self.store = self._start_store()

    def _start_store(self) -> subprocess.Popen[bytes]:
        """A store process on a fresh port: a restarted group never meets the old store's connections."""
        self.port = processes.free_port()
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubetrain_trainer.rendezvous_store",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            env={**os.environ, "PATH": self._path},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def restart_group(self) -> None:
        """Stop every worker and what is left of the store, then start a new store (the rendezvous lost)."""
        self._stop_group()
        self.store = self._start_store()

    def say(self, text: str) -> None:
        with self._lock:
            self.out.write(f"kubetrain: {text}\n")
            self.out.flush()

    def wait_for_store(self) -> bool:
        """Whether the store listens (before any agent looks for it)."""
        deadline = time.monotonic() + STORE_START_SECONDS
        while time.monotonic() < deadline and self.store.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
            time.sleep(POLL_SECONDS)
        return False

    def start(self, index: int, attempt: int) -> Member:
        """Worker `index` as its pod would run, rendered for `attempt`, pointed at the local store."""
        namespace = self.job.metadata.get("namespace", "default")
        context = builders.Context(
            owner=builders.Owner(self.job.metadata.get("name", "local"), namespace, "local"),
            spec=self.job.spec,
            restart_attempt=attempt,
            default_image="kubetrain:local",
        )
        manifest = builders.build_worker_job(context, index)
        worker = processes.local_worker(
            index,
            manifest["spec"]["template"]["spec"]["containers"][0],
            pod_name=manifest["metadata"]["name"],
            namespace=namespace,
            directories=self.directories,
            master_port=self.port,
        )
        for fixed in (
            contract.MASTER_ADDR,
            contract.MASTER_PORT,
            contract.PET_MASTER_ADDR,
            contract.PET_MASTER_PORT,
        ):
            worker.env.pop(fixed)  # torchrun sets MASTER_* per rendezvous round
        termination_log = Path(self._records.name) / f"worker-{index}-attempt-{attempt}"
        termination_log.touch()
        env = {
            **os.environ,
            "PATH": self._path,
            **worker.env,
            contract.PET_RDZV_ENDPOINT: f"127.0.0.1:{self.port}",
            contract.PET_LOCAL_ADDR: "127.0.0.1",
            contract.TERMINATION_LOG: str(termination_log),
        }
        process = subprocess.Popen(
            worker.argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        tail: collections.deque[str] = collections.deque(maxlen=processes.LOG_TAIL_LINES)
        stream = threading.Thread(target=self._stream, args=(index, process, tail), daemon=True)
        stream.start()
        member = Member(index, attempt, process, termination_log, tail, stream, manifest["metadata"]["name"])
        self.members[index] = member
        self.say(f"started worker {index} (attempt {attempt}, pid {process.pid})")
        return member

    def _stream(self, index: int, process: subprocess.Popen[str], tail: collections.deque[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line)
            with self._lock:
                self.out.write(f"[worker-{index}] {line}")
                self.out.flush()

    def stop(self, member: Member) -> None:
        """SIGTERM the worker, SIGKILL what is left of it after the grace period (the kubelet's way)."""
        member.signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            member.process.wait(timeout=processes.STOP_GRACE_SECONDS)
        member.signal(signal.SIGKILL)
        member.process.wait()
        member.stream.join(timeout=5)

    def stop_all(self) -> None:
        self._stop_group()
        self._records.cleanup()

    def _stop_group(self) -> None:
        for member in list(self.members.values()):
            self.stop(member)
        self.members.clear()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.store.pid, signal.SIGKILL)
        self.store.wait()


def run_local_elastic(
    job: api.TrainingJob,
    directories: Mapping[str, Path],
    out: TextIO = sys.stdout,
    *,
    desired: Callable[[], int] | None = None,
    capacity: Callable[[], int] | None = None,
    on_start: Callable[[Member], None] | None = None,
) -> processes.LocalResult:
    """Run an elastic job here until it succeeds or fails.

    `desired` says spec.workers as it is now (default: the spec's); `capacity` how many workers this
    machine can run now (default: all), the local stand-in for free nodes: a worker beyond it waits,
    as an unschedulable pod does, and starts when capacity returns. `on_start` sees every started worker.
    """
    spec = job.spec
    assert spec.elastic is not None
    for directory in directories.values():
        directory.mkdir(parents=True, exist_ok=True)
    run = ElasticRun(job, directories, out)
    counter = restarts = 0
    attempts: dict[int, int] = {}
    """Each waiting worker's attempt: a replacement's is fixed when its predecessor fails."""
    finished = False

    def result(phase: str, reason: str, message: str) -> processes.LocalResult:
        run.stop_all()
        return processes.LocalResult(phase, reason, message, restarts)

    try:
        if not run.wait_for_store():
            return result("Failed", "RendezvousLost", "the rendezvous store process did not start")
        run.say(f"rendezvous store on 127.0.0.1:{run.port} (pid {run.store.pid})")
        while True:
            if run.store.poll() is not None and not finished:
                why = f"the rendezvous store process exited with code {run.store.returncode}"
                decision = elastic_group.decide_rendezvous_loss(spec, why, restarts)
                if decision.action == "fail":
                    return result("Failed", decision.reason, decision.message)
                restarts += 1
                counter += 1
                attempts.clear()
                run.say(decision.message)
                run.restart_group()
                if not run.wait_for_store():
                    return result("Failed", "RendezvousLost", "the restarted rendezvous store did not start")
                run.say(f"rendezvous store on 127.0.0.1:{run.port} (pid {run.store.pid})")
            for member in [m for m in run.members.values() if m.process.poll() is not None]:
                del run.members[member.index]
                member.signal(signal.SIGKILL)  # the container ended: nothing of it lives on
                code = member.process.returncode
                code = code if code >= 0 else 128 - code
                if code == 0:
                    finished = True
                    run.say(f"worker {member.index} succeeded")
                    continue
                if finished:
                    continue  # training is over: a late failure is not replaced
                worker = Worker(
                    index=member.index,
                    attempt=member.attempt,
                    phase="failed",
                    exit_code=termination.recorded_exit_code(code, member.termination_message()),
                )
                decision = elastic_group.decide_failure(spec, worker, restarts)
                if decision.action == "fail":
                    return result("Failed", decision.reason, decision.message)
                restarts += 1
                counter += 1
                attempts[member.index] = counter
                run.say(decision.message)
            if finished:
                if not run.members:
                    return result("Succeeded", "TrainingFinished", "training finished")
                time.sleep(POLL_SECONDS)
                continue
            wanted = desired() if desired is not None else spec.workers
            removed = sorted(i for i in run.members if i >= wanted)
            if removed:
                counter += 1
                run.say(f"spec.workers is {wanted}: removing worker {', '.join(map(str, removed))}")
                for index in removed:
                    run.stop(run.members.pop(index))
            for index in range(wanted):
                room = capacity() if capacity is not None else wanted
                if index not in run.members and len(run.members) < room:
                    member = run.start(index, attempts.pop(index, counter))
                    if on_start is not None:
                        on_start(member)
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        return result("Failed", "Interrupted", "interrupted; every worker was stopped")
