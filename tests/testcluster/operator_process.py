"""Running kubetrain's operator as a real process against a test cluster, and watching what it creates."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from testcluster import processes
from testcluster.cluster import Cluster
from testcluster.waiting import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = REPO_ROOT / "crds" / "kubetrain.io_trainingjobs.yaml"


def install_crd(cluster: Cluster) -> None:
    """Apply the CRD and wait until it is served; right after start-up kubectl's discovery may not know
    the `crd` resource yet, so the wait itself is retried until the deadline."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    wait_for(
        lambda: (
            cluster.run_kubectl(
                "wait",
                "--for=condition=Established",
                "customresourcedefinition/trainingjobs.kubetrain.io",
                "--timeout=10s",
            ).returncode
            == 0
        ),
        "the TrainingJob CRD to be Established",
        timeout=90,
        interval=1.0,
    )


class OperatorProcess:
    """`kubetrain operator` in its own process group; `kill()` is a SIGKILL, as a crashing node would do.

    `env` adds environment variables (e.g. POD_NAME, the replica's identity in a Lease); `metrics_port`
    serves /metrics there (`metrics_url`); `namespaces` watches only those, instead of every namespace."""

    def __init__(
        self,
        cluster: Cluster,
        log_path: Path,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        metrics_port: int | None = None,
        *,
        namespaces: tuple[str, ...] = (),
    ) -> None:
        self._cluster = cluster
        self._log_path = log_path
        self._extra_args = extra_args + (("--metrics-port", str(metrics_port)) if metrics_port else ())
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port else None
        self._env = env or {}
        self._scope = [f"--namespace={name}" for name in namespaces] or ["--all-namespaces"]
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0, wait_live: bool = True) -> None:
        """Start the operator and wait until its liveness endpoint answers (kopf serves it once running, a
        leader-election standby while it stands by); `wait_live=False` returns at once.

        Each start gets a free liveness port: operators of concurrent test runs must not collide.
        """
        port = processes.free_port()
        env = {**os.environ, **self._env, "KUBECONFIG": str(self._cluster.kubeconfig)}
        argv = [sys.executable, "-m", "kubetrain_operator.cli", "operator", *self._scope]
        argv += ["--liveness", f"http://127.0.0.1:{port}/healthz", *self._extra_args]
        with self._log_path.open("ab") as log:
            self._process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        if not wait_live:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"operator exited with {self._process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"operator not live after {timeout:.0f}s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    def wait(self, timeout: float) -> int:
        """The exit status once the process has ended by itself within `timeout` seconds."""
        assert self._process is not None, "not started"
        return self._process.wait(timeout)

    def kill(self) -> None:
        if self._process is not None:
            processes.stop_group(self._process.pid, grace_seconds=0.0)
            self._process.wait()
            self._process = None

    def stop(self) -> None:
        if self._process is not None:
            processes.stop_group(self._process.pid)
            self._process.wait()
            self._process = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])


class CreationCounter:
    """Counts ADDED watch events per child (kind, namespace, name, uid) from the moment it starts.

    A child that is ever created twice under one name shows up as two uids for one name. When the API
    server no longer has the watch's version (410 Gone, after a long pause or a compaction), the counter
    lists again and counts the uids it had not seen; `relists` says how often, since an object created and
    deleted within such a gap is never seen.
    """

    def __init__(self, cluster: Cluster) -> None:
        self._api = client.ApiClient(config.load_kube_config(config_file=str(cluster.kubeconfig)) or None)
        self.created: Counter[tuple[str, str, str]] = Counter()
        self.uids: dict[tuple[str, str, str], set[str]] = {}
        self.relists = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        batch, core = client.BatchV1Api(self._api), client.CoreV1Api(self._api)
        listers = {"Job": batch.list_job_for_all_namespaces, "Service": core.list_service_for_all_namespaces}
        for kind, lister in listers.items():
            resource_version = lister(limit=1).metadata.resource_version
            thread = threading.Thread(target=self._watch, args=(kind, lister, resource_version), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _watch(self, kind: str, lister: Any, resource_version: str) -> None:
        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    lister,
                    resource_version=resource_version,
                    label_selector="kubetrain.io/job-name",
                    allow_watch_bookmarks=True,
                    timeout_seconds=5,
                ):
                    obj = event["object"]
                    resource_version = obj.metadata.resource_version
                    if event["type"] == "ADDED":
                        self._saw(kind, obj)
                    if self._stop.is_set():
                        break
            except client.ApiException as exc:
                if exc.status == 410:
                    resource_version = self._relist(kind, lister)
                else:
                    time.sleep(0.2)
            except Exception:
                time.sleep(0.2)

    def _relist(self, kind: str, lister: Any) -> str:
        listing = lister(label_selector="kubetrain.io/job-name")
        for obj in listing.items:
            self._saw(kind, obj)
        with self._lock:
            self.relists += 1
        return listing.metadata.resource_version

    def _saw(self, kind: str, obj: Any) -> None:
        key = (kind, obj.metadata.namespace, obj.metadata.name)
        with self._lock:
            if obj.metadata.uid not in self.uids.setdefault(key, set()):
                self.uids[key].add(obj.metadata.uid)
                self.created[key] += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def count(self, namespace: str) -> int:
        """Children created in `namespace` so far (each name once)."""
        with self._lock:
            return sum(1 for key in self.created if key[1] == namespace)

    def duplicates(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            return {key: count for key, count in self.created.items() if count > 1}
