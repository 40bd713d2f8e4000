"""`kubetrain artifacts tj/NAME --to DIR`: a finished job's output directory copied to this machine.

Everything goes through the Kubernetes API with the official client (kubeconfig, or the in-cluster
account): a helper pod mounting the job's claim read-only is created, a tar of the job's directory is
streamed out through the pod's `exec` subresource (a websocket, binary), unpacked into a staging
directory inside DIR and moved into place once whole, and the pod is deleted in a `finally`, so an error,
Ctrl-C or SIGTERM never leaves it behind. kubectl is not needed.
"""

from __future__ import annotations

import io
import json
import secrets
import shutil
import signal
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubetrain_operator.api import constants
from kubetrain_operator.remote import outputs
from kubetrain_operator.runtime import kube

USER_AGENT = "kubetrain-artifacts"
POLL_SECONDS = 1.0
IDLE_SECONDS = 300.0
"""A stream that brings no byte for this long is taken for lost."""
GONE_SECONDS = 60.0
"""How long the command waits, at the end, for the deleted helper pod to be gone."""
STDOUT, STDERR, ERROR = 1, 2, 3
"""The exec stream's channels."""
STARTING_FAILURES = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}


class CopyError(Exception):
    """The copy did not finish; the message says where it stopped."""


def default_namespace() -> str:
    """The kubeconfig's current context's namespace, the pod's own in a cluster, else 'default'."""
    in_cluster = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if in_cluster.is_file():
        return in_cluster.read_text().strip() or "default"
    from kubernetes import config

    try:
        _, current = config.list_kube_config_contexts()
    except (config.ConfigException, OSError):
        return "default"
    return (current or {}).get("context", {}).get("namespace") or "default"


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt as Ctrl-C does, so the `finally` that deletes the pod runs."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _pod_problem(pod: dict[str, Any]) -> str | None:
    """Why a helper pod will never run, from its status; None while it may still start."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return (
            f"it ended {status['phase']}: {status.get('reason') or ''} {status.get('message') or ''}".strip()
        )
    for container in status.get("containerStatuses") or ():
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STARTING_FAILURES:
            return f"{waiting['reason']}: {waiting.get('message', '')} (choose another image with --image)"
    return None


def _pod_story(pod: dict[str, Any] | None) -> str:
    """The pod's conditions and container states, for a pod that did not start in time."""
    if pod is None:
        return "the pod is gone"
    status = pod.get("status") or {}
    parts = [f"phase {status.get('phase')}"]
    parts += [
        f"{c['type']}={c['status']} {c.get('reason', '')} {c.get('message', '')}".strip()
        for c in status.get("conditions") or ()
        if c.get("status") != "True"
    ]
    parts += [json.dumps(c.get("state")) for c in status.get("containerStatuses") or ()]
    return "; ".join(parts)


def _wait_running(client: kube.Kube, namespace: str, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pod: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        pod = client.get("Pod", namespace, name)
        if pod is None:
            raise CopyError(f"the helper pod {name} was deleted before it ran")
        if (pod.get("status") or {}).get("phase") == "Running":
            return
        problem = _pod_problem(pod)
        if problem:
            raise CopyError(f"the helper pod {name} cannot run: {problem}")
        time.sleep(POLL_SECONDS)
    raise CopyError(
        f"the helper pod {name} did not start in {timeout:.0f} s (--start-timeout): {_pod_story(pod)}"
    )


class ExecStdout(io.RawIOBase):
    """The exec's stdout as a readable binary file (for tarfile's stream mode); stderr and the error
    channel are kept for the verdict."""

    def __init__(self, socket: Any, idle_seconds: float = IDLE_SECONDS) -> None:
        self._socket = socket
        self._idle = idle_seconds
        self._buffer = bytearray()
        self.stderr = bytearray()
        self.error = bytearray()
        self.received = 0

    def readable(self) -> bool:
        return True

    def _pull(self) -> None:
        self._buffer += self._socket.read_channel(STDOUT)
        self.stderr += self._socket.read_channel(STDERR)
        self.error += self._socket.read_channel(ERROR)

    def readinto(self, target: Any) -> int:
        quiet_since = time.monotonic()
        while not self._buffer:
            self._pull()
            if self._buffer or not self._socket.is_open():
                break
            if time.monotonic() - quiet_since > self._idle:
                raise CopyError(f"the copy stream brought nothing for {self._idle:.0f} s")
            self._socket.update(timeout=POLL_SECONDS)
        count = min(len(target), len(self._buffer))
        target[:count] = self._buffer[:count]
        del self._buffer[:count]
        self.received += count
        return count

    def drain(self) -> None:
        """Read to the end of the stream, so the exit status on the error channel has arrived."""
        while self.read(1 << 20):
            pass
        self._pull()

    def verdict(self) -> str | None:
        """None when the packer exited 0; else what went wrong, from its stderr and exit status."""
        text = self.stderr.decode(errors="replace").strip()
        try:
            status = json.loads(self.error.decode() or "{}")
        except ValueError:
            status = {}
        if status.get("status") == "Success":
            return None
        return text or status.get("message") or "the stream ended without an exit status"


def _exec(api_client: Any, namespace: str, name: str, command: list[str]) -> Any:
    from kubernetes import client
    from kubernetes.stream import stream

    return stream(
        client.CoreV1Api(api_client).connect_get_namespaced_pod_exec,
        name,
        namespace,
        container=outputs.CONTAINER,
        command=command,
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        binary=True,
        _preload_content=False,
    )


def _unpack(stdout: ExecStdout, staging: Path) -> None:
    try:
        with tarfile.open(fileobj=stdout, mode="r|") as archive:
            archive.extractall(staging, filter="data")
    except (tarfile.TarError, OSError) as exc:
        stdout.drain()
        raise CopyError(
            stdout.verdict() or f"the tar stream broke after {stdout.received} bytes: {exc}"
        ) from exc
    stdout.drain()
    problem = stdout.verdict()
    if problem:
        raise CopyError(problem)


def _move_into(staging: Path, target: Path) -> list[str]:
    """Each unpacked entry replaces its namesake in `target`; other files there stay."""
    moved = []
    for entry in sorted(staging.iterdir()):
        destination = target / entry.name
        if destination.is_dir() and not destination.is_symlink():
            shutil.rmtree(destination)
        elif destination.exists() or destination.is_symlink():
            destination.unlink()
        entry.rename(destination)
        moved.append(entry.name)
    return moved


def _delete(client: kube.Kube, namespace: str, name: str, say: Callable[[str], None]) -> None:
    """Delete the helper pod and wait (a little) until it is gone; never raises."""
    try:
        client.delete("Pod", namespace, name)
        deadline = time.monotonic() + GONE_SECONDS
        while client.get("Pod", namespace, name) is not None:
            if time.monotonic() > deadline:
                say(f"the helper pod {namespace}/{name} is still terminating; it goes by itself")
                return
            time.sleep(POLL_SECONDS)
    except (kube.ApiError, KeyboardInterrupt) as exc:
        say(
            f"could not delete the helper pod {namespace}/{name} ({exc}): "
            f"`kubectl delete pod -n {namespace} {name}`"
        )


def copy(
    reference: str,
    target: Path,
    *,
    namespace: str | None,
    checkpoints: bool,
    unfinished: bool,
    image: str | None,
    start_timeout: float,
    api_client: Any = None,
) -> int:
    """The command: 0 copied, 1 the copy failed, 2 refused (a message on stderr says why)."""

    def say(text: str) -> None:
        print(f"kubetrain artifacts: {text}", file=sys.stderr)

    try:
        name = outputs.job_name(reference)
    except ValueError as exc:
        say(str(exc))
        return 2
    if target.exists() and not target.is_dir():
        say(f"--to {target} is a file, not a directory")
        return 2
    namespace = namespace or default_namespace()
    if api_client is None:
        from kubernetes.config import ConfigException

        try:
            api_client = kube.make_api_client(USER_AGENT)
        except ConfigException as exc:
            say(f"no cluster to talk to: {exc} (set KUBECONFIG or use ~/.kube/config)")
            return 1
    client = kube.Kube(api_client)
    try:
        job = client.get(constants.KIND, namespace, name)
    except kube.ApiError as exc:
        say(f"cannot read tj/{name} in namespace {namespace}: {exc}")
        return 1
    if job is None:
        say(f"no TrainingJob {name} in namespace {namespace}")
        return 2
    try:
        outputs.check_finished(job, unfinished=unfinished)
        location = outputs.locate(job)
    except outputs.RefusedError as exc:
        say(str(exc))
        return 2

    pod = outputs.pod_name(name, secrets.token_hex(3))
    manifest = outputs.helper_pod(job, location, name=pod, image=outputs.helper_image(job, image))
    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".kubetrain-artifacts-", dir=target))
    started = time.monotonic()
    socket = None
    try:
        with _sigterm_interrupts():
            try:
                say(f"copying {location.described} through pod {namespace}/{pod}")
                client.create(manifest)
                _wait_running(client, namespace, pod, start_timeout)
                socket = _exec(
                    api_client, namespace, pod, outputs.pack_command(location, checkpoints=checkpoints)
                )
                stdout = ExecStdout(socket)
                _unpack(stdout, staging)
            finally:
                if socket is not None:
                    socket.close()
                _delete(client, namespace, pod, say)
        moved = _move_into(staging, target)
    except (CopyError, kube.ApiError) as exc:
        say(str(exc))
        return 1
    except KeyboardInterrupt:
        say("interrupted; nothing was copied")
        return 130
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    left_out = "" if checkpoints else f" ({outputs.CHECKPOINTS}/ left out: --checkpoints copies it)"
    say(
        f"copied {', '.join(moved) or 'nothing'} into {target} "
        f"({stdout.received / 1e6:.1f} MB in {time.monotonic() - started:.0f} s){left_out}"
    )
    return 0
