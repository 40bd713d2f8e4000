"""A kubelet for pods that must really run: their containers become local processes.

kwok simulates every pod except those annotated `sim.kubetrain.io/real: "true"`. For those, this class
does the kubelet's work: it waits until the scheduler has bound them, runs each container's command with
the env the operator rendered (through `processes.local_worker`, which moves only the master address to
127.0.0.1 and, so parallel test runs cannot collide, the rendezvous port to a free one; volume mount
paths become directories of the test), gives the processes a service-account token as a kubelet would,
and writes their real phases and exit codes back as pod status.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubetrain_operator.local import processes
from kubetrain_trainer import contract

from testcluster.cluster import Cluster

REAL_ANNOTATION = "sim.kubetrain.io/real"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RealKubelet:
    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self._cluster = cluster
        self._workdir = workdir

    def _pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        listing = self._cluster.kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json")
        return json.loads(listing)["items"]

    def _patch_status(self, namespace: str, pod: str, status: dict[str, Any]) -> None:
        self._cluster.kubectl(
            "-n", namespace, "patch", "pod", pod, "--subresource=status", "-p", json.dumps({"status": status})
        )

    def _service_account_dir(self, namespace: str, account: str) -> Path:
        directory = self._workdir / "serviceaccount" / namespace / account
        directory.mkdir(parents=True, exist_ok=True)
        token = self._cluster.kubectl("-n", namespace, "create", "token", account).strip()
        (directory / "token").write_text(token)
        shutil.copy(self._cluster.directory / "pki" / "ca.crt", directory / "ca.crt")
        return directory

    def run(self, namespace: str, selector: str, expected: int, timeout: float = 300.0) -> dict[str, int]:
        """Run the `expected` bound pods matching `selector` to completion; return pod name -> exit code."""
        deadline = time.monotonic() + timeout
        scheduling_deadline = time.monotonic() + min(timeout, 90.0)
        pods: list[dict[str, Any]] = []
        while time.monotonic() < scheduling_deadline:
            pods = [p for p in self._pods(namespace, selector) if p["spec"].get("nodeName")]
            if len(pods) == expected:
                break
            time.sleep(0.3)
        else:
            story = self._cluster.kubectl(
                "-n", namespace, "get", "trainingjobs,jobs,pods,events", check=False
            )
            raise AssertionError(
                f"{len(pods)} of {expected} pods matching {selector} were scheduled:\n{story}"
            )
        for pod in pods:
            if pod["metadata"].get("annotations", {}).get(REAL_ANNOTATION) != "true":
                raise AssertionError(
                    f"pod {pod['metadata']['name']} lacks {REAL_ANNOTATION}: kwok would race us"
                )

        master_port = processes.free_port()
        running: dict[str, subprocess.Popen[bytes]] = {}
        started = _now()
        for pod in sorted(pods, key=lambda p: int(p["metadata"]["labels"]["kubetrain.io/worker-index"])):
            name, spec = pod["metadata"]["name"], pod["spec"]
            container = spec["containers"][0]
            directories = {
                mount["mountPath"]: self._workdir / "volumes" / mount["name"]
                for mount in container.get("volumeMounts", [])
                if mount["mountPath"] != "/dev/shm"
            }
            for directory in directories.values():
                directory.mkdir(parents=True, exist_ok=True)
            index = int(pod["metadata"]["labels"]["kubetrain.io/worker-index"])
            worker = processes.local_worker(
                index,
                container,
                pod_name=name,
                namespace=namespace,
                directories=directories,
                master_port=master_port,
            )
            account = self._service_account_dir(namespace, spec.get("serviceAccountName", "default"))
            in_cluster = {
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self._cluster.api_port),
                "KUBETRAIN_SERVICE_ACCOUNT_DIR": str(account),
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            }
            # The container's terminationMessagePath, as the kubelet provides it: an empty file per container.
            termination_log = self._workdir / f"{name}.termination-log"
            termination_log.write_text("")
            in_cluster[contract.TERMINATION_LOG] = str(termination_log)
            log = (self._workdir / f"{name}.log").open("wb")
            running[name] = subprocess.Popen(
                worker.argv,
                env={**os.environ, **worker.env, **in_cluster},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            self._patch_status(namespace, name, self._running_status(container, started))

        exit_codes: dict[str, int] = {}
        for name, process in running.items():
            remaining = max(1.0, deadline - time.monotonic())
            try:
                exit_codes[name] = process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                for other in running.values():
                    other.kill()
                raise
        containers = {p["metadata"]["name"]: p["spec"]["containers"][0] for p in pods}
        for name, code in exit_codes.items():
            status = self._terminated_status(containers[name], code, started, self._termination_message(name))
            self._patch_status(namespace, name, status)
        return exit_codes

    def _termination_message(self, pod: str) -> str:
        """The termination-log file, else (FallbackToLogsOnError) the log's last 80 lines, at most 2 KiB."""
        recorded = (self._workdir / f"{pod}.termination-log").read_text(errors="replace")
        if recorded:
            return recorded
        tail = "\n".join(self.log(pod).splitlines()[-80:])
        return tail.encode()[-2048:].decode(errors="replace")

    def log(self, pod: str) -> str:
        return (self._workdir / f"{pod}.log").read_text(errors="replace")

    @staticmethod
    def _running_status(container: dict[str, Any], started: str) -> dict[str, Any]:
        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": started}
            for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        state = {"running": {"startedAt": started}}
        return {
            "phase": "Running",
            "startTime": started,
            "podIP": "127.0.0.1",
            "conditions": conditions,
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }

    @staticmethod
    def _terminated_status(
        container: dict[str, Any], exit_code: int, started: str, message: str
    ) -> dict[str, Any]:
        terminated = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": started,
            "finishedAt": _now(),
        }
        if exit_code != 0 and message:
            terminated["message"] = message
        return {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": _now()},
                {"type": "ContainersReady", "status": "False", "lastTransitionTime": _now()},
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
