"""A TrainingJob's worker pods as processes on this machine: what `kubetrain run --local` runs.

The worker pods are rendered by the operator's own builders (`builders.build_worker_jobs`), so the same
spec that runs here runs on a cluster. Only what a pod has and a laptop has not is translated:
- MASTER_ADDR / PET_MASTER_ADDR become 127.0.0.1 and the rendezvous port a free local port;
- every volume mount path becomes a local directory (`--mount NAME=DIR`, a hostPath's own path, or
  `<workdir>/<name>`), rewritten wherever a worker's args or env (including the trainer config JSON)
  name a path under it;
- downward-API fields get their local equivalents; Secrets and ConfigMaps are refused by name.
The groups that run them behave as the operator makes them behave: `group_run` (a failed worker stops
the others, retryable failures restart the whole group) and `elastic_run` (one worker replaced at a time,
spec.workers scaled by editing the file); both end with the status the operator would report.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubetrain_trainer import contract

from kubetrain_operator import api
from kubetrain_operator.local import manifests
from kubetrain_operator.planning import builders

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


def parse_mounts(values: list[str]) -> dict[str, Path]:
    mounts: dict[str, Path] = {}
    for value in values:
        name, sep, directory = value.partition("=")
        if not sep or not name or not directory:
            raise LocalRunError(f"--mount {value!r}: expected NAME=DIRECTORY")
        mounts[name] = Path(directory)
    return mounts
