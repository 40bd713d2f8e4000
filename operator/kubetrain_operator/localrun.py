"""`kubetrain run -f trainingjob.yaml --local`: a TrainingJob's workers as processes on this machine.

The worker pods are rendered by the operator's own builders (`builders.build_worker_jobs`), so the same
spec that runs here runs on a cluster. Only what a pod has and a laptop has not is translated:
- MASTER_ADDR / PET_MASTER_ADDR become 127.0.0.1 and the rendezvous port a free local port;
- every volume mount path becomes a local directory (`--mount NAME=DIR`, a hostPath's own path, or
  `<workdir>/<name>`), rewritten wherever a worker's args or env (including the trainer config JSON)
  name a path under it;
- downward-API fields get their local equivalents; Secrets and ConfigMaps are refused by name.
The group then behaves as the operator makes it behave: a failed worker stops the others, retryable
failures restart the whole group up to runPolicy.maxRestarts (`failure.decide`, shared with the
operator), and the run ends with the status the operator would report. An elastic job (spec.elastic)
runs under `localelastic` instead: one worker replaced at a time, spec.workers scaled by editing the file.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from kubetrain_trainer import contract, termination

from kubetrain_operator import api, builders, failure, manifests
from kubetrain_operator.observe import Worker

_VAR_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_LOCAL_FIELDS = {"spec.nodeName": "localhost", "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
STOP_GRACE_SECONDS = 10.0
LOG_TAIL_LINES = 80
"""Like the kubelet's FallbackToLogsOnError: a worker that recorded nothing is explained by its log's tail."""


class LocalRunError(ValueError):
    """The manifest cannot run locally; the message names the file, field or variable."""


@dataclasses.dataclass(frozen=True)
class LocalWorker:
    """One worker as a local process: what to exec and with which environment."""

    index: int
    argv: list[str]
    env: dict[str, str]


def load_trainingjob(path: Path) -> api.TrainingJob:
    """Parse and validate a one-TrainingJob manifest with the same models the CRD is generated from."""
    try:
        documents = manifests.read_documents(path)
        if len(documents) > 1:
            raise manifests.ManifestError(
                f"{path}: holds {len(documents)} documents: expected one TrainingJob"
            )
        return manifests.parse_trainingjob(documents[0])
    except manifests.ManifestError as error:
        raise LocalRunError(str(error)) from error


def provide_sample(job: api.TrainingJob, directories: Mapping[str, Path], manifest: Path) -> str | None:
    """Extract `<manifest dir>/data/<name>.tar.gz` when the built-in trainer's data root (as mapped here)
    does not exist and is named `<name>`: the examples run from a fresh clone with no flags, their
    committed CIFAR sample unpacked where the data volume's local directory puts it. What was done, or
    None when there was nothing to do."""
    trainer = job.spec.trainer
    if trainer is None or trainer.data.dataset == "fake":
        return None
    root = Path(_rewrite_path(trainer.data.root, directories))
    archive = manifest.parent / "data" / f"{root.name}.tar.gz"
    if root.exists() or not archive.is_file():
        return None
    root.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as members:
        members.extractall(root.parent, filter="data")
    return f"extracted {archive} into {root.parent} (data.root {trainer.data.root} was not there)"


def mount_directories(
    spec: api.TrainingJobSpec, overrides: Mapping[str, Path], workdir: Path
) -> dict[str, Path]:
    """Container mount path -> local directory for every storage volume of the spec."""
    unknown = set(overrides) - {volume.name for volume in spec.storage or ()}
    if unknown:
        raise LocalRunError(f"--mount names no volume of spec.storage: {', '.join(sorted(unknown))}")
    directories: dict[str, Path] = {}
    for volume in spec.storage or ():
        if volume.name in overrides:
            local = overrides[volume.name]
        elif volume.host_path is not None:
            local = Path(volume.host_path.path)
        else:
            local = workdir / volume.name
        directories[volume.mount_path] = local.resolve()
    return directories


def _rewrite_path(value: str, directories: Mapping[str, Path]) -> str:
    for mount_path in sorted(directories, key=len, reverse=True):
        if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
            return str(directories[mount_path]) + value[len(mount_path.rstrip("/")) :]
    return value


def _rewrite_json_paths(node: Any, directories: Mapping[str, Path]) -> Any:
    if isinstance(node, str):
        return _rewrite_path(node, directories)
    if isinstance(node, list):
        return [_rewrite_json_paths(item, directories) for item in node]
    if isinstance(node, dict):
        return {key: _rewrite_json_paths(item, directories) for key, item in node.items()}
    return node


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: references to defined variables are replaced, others kept."""
    return _VAR_REFERENCE.sub(lambda match: env.get(match.group(1), match.group(0)), text)


def _resolve_env(
    container_env: list[dict[str, Any]], pod_name: str, namespace: str, directories: Mapping[str, Path]
) -> dict[str, str]:
    env: dict[str, str] = {}
    for variable in container_env:
        name = variable["name"]
        if "value" in variable:
            value = _expand(variable["value"], env)
        else:
            field = variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if field == "metadata.name":
                value = pod_name
            elif field == "metadata.namespace":
                value = namespace
            elif field in _LOCAL_FIELDS:
                value = _LOCAL_FIELDS[field]
            else:
                source = next(iter(variable.get("valueFrom", {})), "valueFrom")
                raise LocalRunError(
                    f"env {name}: {source} has no local equivalent; set a plain value to run locally"
                )
        if name == contract.TRAINER_CONFIG:
            value = json.dumps(_rewrite_json_paths(json.loads(value), directories), separators=(",", ":"))
        else:
            value = _rewrite_path(value, directories)
        env[name] = value
    return env


def plan_local_workers(
    job: api.TrainingJob,
    directories: Mapping[str, Path],
    *,
    master_port: int,
    restart_attempt: int = 0,
    default_image: str = "kubetrain:local",
) -> list[LocalWorker]:
    """Render the worker pods exactly as the operator would and translate each into a local process."""
    namespace = job.metadata.get("namespace", "default")
    owner = builders.Owner(name=job.metadata.get("name", "local"), namespace=namespace, uid="local")
    context = builders.Context(
        owner=owner, spec=job.spec, restart_attempt=restart_attempt, default_image=default_image
    )
    return [
        local_worker(
            index,
            worker_job["spec"]["template"]["spec"]["containers"][0],
            pod_name=worker_job["metadata"]["name"],
            namespace=namespace,
            directories=directories,
            master_port=master_port,
        )
        for index, worker_job in enumerate(builders.build_worker_jobs(context))
    ]


def local_worker(
    index: int,
    container: Mapping[str, Any],
    *,
    pod_name: str,
    namespace: str,
    directories: Mapping[str, Path],
    master_port: int,
) -> LocalWorker:
    """One rendered worker container as a local process; the master moves to 127.0.0.1:`master_port`."""
    env = _resolve_env(container.get("env", []), pod_name, namespace, directories)
    env.update(
        {
            contract.MASTER_ADDR: "127.0.0.1",
            contract.PET_MASTER_ADDR: "127.0.0.1",
            contract.MASTER_PORT: str(master_port),
            contract.PET_MASTER_PORT: str(master_port),
        }
    )
    argv = [*container.get("command", []), *container.get("args", [])]
    return LocalWorker(
        index=index, argv=[_rewrite_path(_expand(arg, env), directories) for arg in argv], env=env
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Group:
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


@dataclasses.dataclass(frozen=True)
class LocalResult:
    """The status the operator would have reported for the same outcome."""

    phase: str
    reason: str
    message: str
    restarts: int

    @property
    def exit_code(self) -> int:
        return 0 if self.phase == "Succeeded" else 1


def run_local(
    job: api.TrainingJob,
    directories: Mapping[str, Path],
    out: TextIO = sys.stdout,
    on_group: Callable[[_Group], None] | None = None,
) -> LocalResult:
    """Run the job's workers here until the operator's policies say it succeeded or failed."""
    for directory in directories.values():
        directory.mkdir(parents=True, exist_ok=True)
    restarts = 0
    while True:
        workers = plan_local_workers(job, directories, master_port=free_port(), restart_attempt=restarts)
        out.write(f"kubetrain: starting {len(workers)} workers (attempt {restarts})\n")
        group = _Group(workers, out)
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


def parse_mounts(values: list[str]) -> dict[str, Path]:
    mounts: dict[str, Path] = {}
    for value in values:
        name, sep, directory = value.partition("=")
        if not sep or not name or not directory:
            raise LocalRunError(f"--mount {value!r}: expected NAME=DIRECTORY")
        mounts[name] = Path(directory)
    return mounts


def main(manifest: Path, mounts: list[str], workdir: Path) -> int:
    """CLI body of `kubetrain run --local`: prints the final status like `kubectl get tj` would."""
    try:
        job = load_trainingjob(manifest)
        directories = mount_directories(job.spec, parse_mounts(mounts), workdir)
        plan_local_workers(job, directories, master_port=0)  # refuse untranslatable env before starting
    except LocalRunError as error:
        print(f"kubetrain run: {error}", file=sys.stderr)
        return 2
    extracted = provide_sample(job, directories, manifest)
    if extracted is not None:
        print(f"kubetrain: {extracted}")
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        if job.spec.elastic is not None:
            from kubetrain_operator import localelastic  # builds on this module

            desired = localelastic.manifest_workers(manifest, job.spec)
            result = localelastic.run_local_elastic(job, directories, desired=desired)
        else:
            result = run_local(job, directories)
    finally:
        signal.signal(signal.SIGTERM, previous)
    name = job.metadata.get("name", "local")
    print(
        f"trainingjob/{name}: {result.phase} ({result.reason}) restarts={result.restarts}: {result.message}"
    )
    return result.exit_code
