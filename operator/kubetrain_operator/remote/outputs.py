"""Where a TrainingJob's artifacts lie on its volume, and the pod that reads them out. Pure: the job as
the API server returns it in, a location (or a refusal naming the field) and a pod manifest out.

The built-in trainer writes into `<spec.trainer.output_dir>/<job name>/`; the volume holding that path is
the spec.storage entry whose mountPath is output_dir or a parent of it (the deepest one, as in the
container). Only a persistentVolumeClaim outlives the workers and can be mounted by another pod: an
emptyDir went with the pods, a hostPath lives on one node and the `restricted` Pod Security Standard
forbids it in pods.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from kubetrain_trainer.config import TrainerConfig

from kubetrain_operator.api import constants, names
from kubetrain_operator.planning import builders

FINISHED_PHASES = ("Succeeded", "Failed")
CHECKPOINTS = "checkpoints"
"""The sub-directory of the job's output directory holding checkpoints (large: left out by default)."""
CONTAINER = "copy"
VOLUME = "output"
VOLUME_MOUNT = "/volume"
"""Where the helper pod mounts the claim (read-only)."""
POD_LIFETIME_SECONDS = 6 * 3600
"""How long the helper pod lives at most (its container's sleep and activeDeadlineSeconds): a copy that
was killed (kill -9, a lost laptop) cannot leave it running, and one longer than this fails."""
LABEL_ARTIFACTS_OF = "kubetrain.io/artifacts-of"
"""The helper pod's label: the job it copies from (the job-name label's value). Not the job-name label
itself, which would make the operator take the pod for a worker."""
PACKER_USER = 1000
"""The helper's uid and gid: the trainer image's user, who owns what the workers wrote (artifacts from
trainers before 0644 files were mode 0600)."""
JOB_REFERENCE = re.compile(r"^(?:(?:tj|trainingjobs?|trainingjobs?\.kubetrain\.io)/)?([a-z0-9][-a-z0-9.]*)$")

WAIT = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "time.sleep(float(sys.argv[1]))\n"
)
"""The helper container's main process: wait to be exec'd into; leave at once when the pod is deleted (a
Python PID 1 would otherwise ignore SIGTERM and hold the pod for its whole grace period)."""

PACK = (
    "import os, sys, tarfile\n"
    "root, checkpoints = sys.argv[1], sys.argv[2] == 'yes'\n"
    "if not os.path.isdir(root):\n"
    "    sys.exit(f'no directory {sys.argv[3]} on the volume: the job has written nothing there')\n"
    "def add(archive, path, name):\n"
    "    base = name.rsplit('/', 1)[-1]\n"
    "    if base.startswith('.') and base.endswith('.tmp'):\n"
    "        return\n"
    f"    if not checkpoints and name.split('/')[0] == {CHECKPOINTS!r}:\n"
    "        return\n"
    "    try:\n"
    "        if os.path.isfile(path) and not os.path.islink(path):\n"
    "            with open(path, 'rb') as handle:\n"
    "                archive.addfile(archive.gettarinfo(arcname=name, fileobj=handle), handle)\n"
    "            return\n"
    "        archive.addfile(archive.gettarinfo(path, name))\n"
    "        if os.path.isdir(path) and not os.path.islink(path):\n"
    "            for entry in sorted(os.listdir(path)):\n"
    "                add(archive, os.path.join(path, entry), f'{name}/{entry}')\n"
    "    except FileNotFoundError:\n"
    "        pass\n"
    "with tarfile.open(fileobj=sys.stdout.buffer, mode='w|') as archive:\n"
    "    for entry in sorted(os.listdir(root)):\n"
    "        add(archive, os.path.join(root, entry), entry)\n"
)
"""The packer run by exec: a tar of the job's directory on stdout (Python's tarfile, so an image with
Python is all it needs). Leaves out checkpoints/ unless asked, and the `.NAME.*.tmp` files of writes in
flight (atomic.write_atomic), which a running job may have. A running job also deletes files (old
checkpoints pruned) and replaces them (progress.json) while the packer reads: a file gone since it was
listed is skipped, and each file's header is taken from the file it opened, so a replaced one goes in
whole, as it was when opened."""


class RefusedError(Exception):
    """kubetrain cannot copy from this job; the message names the field or the flag that decides."""


@dataclass(frozen=True)
class Location:
    """The job's output directory on a claim."""

    claim: str
    sub_path: str | None
    """The storage entry's subPath: the part of the claim its workers see."""
    directory: str
    """The job's directory relative to what the workers mount (and the helper at VOLUME_MOUNT)."""
    field: str
    """The storage entry, as a field path (spec.storage[1]), for messages."""
    output_dir: str

    @property
    def in_pod(self) -> str:
        return posixpath.join(VOLUME_MOUNT, self.directory)

    @property
    def described(self) -> str:
        """Where the files are, as a user finds them: the claim and the path in it."""
        inside = posixpath.join(self.sub_path, self.directory) if self.sub_path else self.directory
        return f"{inside}/ on claim {self.claim}"


def job_name(reference: str) -> str:
    """The name in `tj/NAME` (also trainingjob/NAME, trainingjobs.kubetrain.io/NAME, or NAME)."""
    match = JOB_REFERENCE.match(reference)
    if match is None:
        raise ValueError(f"{reference!r} is not a TrainingJob reference such as tj/NAME")
    return match.group(1)


def check_finished(job: dict[str, Any], *, unfinished: bool) -> None:
    """Refuse a job that has not finished, unless the user asked for what it wrote so far."""
    phase = (job.get("status") or {}).get("phase") or "Pending"
    if phase in FINISHED_PHASES or unfinished:
        return
    name = job["metadata"]["name"]
    raise RefusedError(
        f"tj/{name} is {phase} (status.phase), not finished: model.pt and the plots are written at the end. "
        f"Wait for Succeeded or Failed, or pass --unfinished to copy what it has written so far."
    )


def _contains(mount_path: str, path: str) -> bool:
    return path == mount_path or path.startswith(mount_path.rstrip("/") + "/")


def locate(job: dict[str, Any]) -> Location:
    """The claim and directory holding the job's artifacts, or RefusedError naming the field that decides."""
    spec = job.get("spec") or {}
    name = job["metadata"]["name"]
    trainer = spec.get("trainer")
    if trainer is None:
        raise RefusedError(
            f"tj/{name} runs its own program (spec.command): only the built-in trainer's output directory "
            f"(spec.trainer.output_dir) is known to kubetrain; copy your program's files from its volume "
            f"yourself"
        )
    output_dir = posixpath.normpath(
        trainer.get("output_dir") or TrainerConfig.model_fields["output_dir"].default
    )
    storage = spec.get("storage") or []
    holding = [
        (index, entry)
        for index, entry in enumerate(storage)
        if output_dir.startswith("/") and _contains(entry.get("mountPath", ""), output_dir)
    ]
    if not holding:
        mounts = ", ".join(entry.get("mountPath", "?") for entry in storage) or "none"
        raise RefusedError(
            f"tj/{name}'s spec.trainer.output_dir {output_dir} is on none of its spec.storage volumes "
            f"(mountPaths: {mounts}): the artifacts stayed in the worker containers"
        )
    index, entry = max(holding, key=lambda pair: len(pair[1]["mountPath"]))
    field = f"spec.storage[{index}]"
    claim = entry.get("persistentVolumeClaim")
    if claim is None:
        kind = "an emptyDir, gone with the worker pods" if "emptyDir" in entry else "a hostPath, on one node"
        raise RefusedError(
            f"tj/{name}'s spec.trainer.output_dir {output_dir} is on {field} ({entry.get('name')}), "
            f"{kind}: kubetrain artifacts copies only from a {field}.persistentVolumeClaim"
        )
    below = posixpath.relpath(output_dir, entry["mountPath"])
    directory = posixpath.normpath(posixpath.join(below, name))
    return Location(
        claim=claim["claimName"],
        sub_path=entry.get("subPath") or None,
        directory=directory,
        field=field,
        output_dir=output_dir,
    )


def helper_image(job: dict[str, Any], override: str | None) -> str:
    """--image, else the job's own spec.image, else the trainer image the chart runs by default."""
    return override or (job.get("spec") or {}).get("image") or constants.TRAINER_IMAGE


def pod_name(job: str, token: str) -> str:
    """`<job>-artifacts-<token>`, the job's name cut so the whole stays a short DNS label."""
    return f"{job[:40].rstrip('-.')}-artifacts-{token}"


def helper_pod(job: dict[str, Any], location: Location, *, name: str, image: str) -> dict[str, Any]:
    """A pod that mounts the claim read-only and waits to be exec'd into, passing the `restricted` Pod
    Security Standard. It is owned by the TrainingJob (no controller), so deleting the job removes a pod
    a killed copy left behind; it lives at most POD_LIFETIME_SECONDS."""
    meta = job["metadata"]
    spec = job.get("spec") or {}
    mount: dict[str, Any] = {"name": VOLUME, "mountPath": VOLUME_MOUNT, "readOnly": True}
    if location.sub_path:
        mount["subPath"] = location.sub_path
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "command": ["python3", "-c", WAIT, str(POD_LIFETIME_SECONDS)],
        "volumeMounts": [mount],
        "securityContext": {**builders.RESTRICTED_CONTAINER_SECURITY, "readOnlyRootFilesystem": True},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    }
    if spec.get("imagePullPolicy"):
        container["imagePullPolicy"] = spec["imagePullPolicy"]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": POD_LIFETIME_SECONDS,
        "terminationGracePeriodSeconds": 5,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": PACKER_USER,
            "runAsGroup": PACKER_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": VOLUME, "persistentVolumeClaim": {"claimName": location.claim, "readOnly": True}}
        ],
    }
    if spec.get("imagePullSecrets"):
        pod_spec["imagePullSecrets"] = spec["imagePullSecrets"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {
                LABEL_ARTIFACTS_OF: names.job_label_value(meta["name"]),
                constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
            },
            "ownerReferences": [
                {
                    "apiVersion": constants.API_VERSION,
                    "kind": constants.KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                }
            ],
        },
        "spec": pod_spec,
    }


def pack_command(location: Location, *, checkpoints: bool) -> list[str]:
    """The exec's command: a tar of the job's directory on stdout."""
    return ["python3", "-c", PACK, location.in_pod, "yes" if checkpoints else "no", location.described]
