"""One real control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and kwok.

By default it listens on loopback and its nodes are kwok's. Given a `Sandbox`, it runs inside that
network namespace instead (for a real node: see `node`), reached from outside through a loopback relay.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testcluster import binaries, pki, processes
from testcluster.sandbox import CLUSTER_IP, Sandbox, start_relay

KWOK_CONFIG = Path(__file__).with_name("kwok.yaml")
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.64.0.0/12"
_COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "apiserver-relay",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
)
_SANDBOX_API_PORT = 6443
WORKLOAD_API_GATES = "--feature-gates=GenericWorkload=true"
"""Kubernetes' native gang scheduling (KEP-4671): the Workload and PodGroup API, the scheduler's
GangScheduling plugin and the controllers that know PodGroups. Beta in 1.37 but off by default
(pkg/features/kube_features.go), so each of the API server, scheduler and controller manager is told."""
WORKLOAD_API_RUNTIME_CONFIG = "--runtime-config=scheduling.k8s.io/v1beta1=true"
"""scheduling.k8s.io/v1beta1 is a beta group version, which the API server leaves unserved unless asked
(betaAPIGroupVersionsDisabledByDefault in pkg/controlplane/instance.go)."""


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call whose message carries kubectl's own explanation."""

    def __str__(self) -> str:
        return f"kubectl {' '.join(self.cmd[3:])} exited {self.returncode}: {(self.stderr or '').strip()}"


class ClusterError(RuntimeError):
    """The control plane failed to start or to become ready; the message points at the component's log."""


@dataclass
class Cluster:
    """A running control plane. `kubeconfig` is what kubectl, the tests and the operator use."""

    directory: Path
    bin_dir: Path
    kubeconfig: Path
    api_port: int
    inner_kubeconfig: Path | None = None
    """For a sandboxed cluster: the kubeconfig of processes inside the sandbox (node components)."""
    pids: dict[str, int] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)
    """Each component's command line as started, so `start_component` can start it again."""
    _health: dict[str, tuple[str, ssl.SSLContext | None]] = field(default_factory=dict, repr=False)
    _detached: bool = False

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def log_dir(self) -> Path:
        return self.directory / "logs"

    def run_kubectl(self, *args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; the caller inspects exit code, stdout and stderr."""
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input_text,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        """Run kubectl against this cluster and return its stdout; raise with stderr when it fails."""
        result = self.run_kubectl(*args, input_text=input_text)
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, result.args, result.stdout, result.stderr)
        return result.stdout

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]]) -> str:
        documents = manifest if isinstance(manifest, list) else [manifest]
        return self.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(documents))

    def add_nodes(
        self,
        count: int,
        *,
        prefix: str = "kwok-node",
        gpus: int = 8,
        labels: dict[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
    ) -> list[str]:
        """Create `count` kwok-managed nodes and wait until each reports Ready. `labels` and `taints` make
        a pool of a test's own, which no other test's pods land on."""
        names = [f"{prefix}-{index}" for index in range(count)]
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        nodes = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})},
                },
                "spec": {"taints": taints or []},
                "status": {"allocatable": capacity, "capacity": capacity},
            }
            for name in names
        ]
        self.apply(nodes)
        self.kubectl("wait", "--for=condition=Ready", "--timeout=120s", *(f"node/{n}" for n in names))
        return names

    def stop_component(self, name: str) -> None:
        """Stop one component (SIGTERM, then SIGKILL after 5 s), for fault-injection tests; the rest keep
        running and `start_component(name)` brings it back."""
        pid = self.pids.get(name)
        if pid is not None:
            processes.stop_group(pid)
        process = self.processes.get(name)
        if process is not None:
            process.wait(timeout=10)

    def start_component(self, name: str, timeout: float = 120.0) -> None:
        """Start a stopped component again with its original command line (same ports, same data), and for
        etcd and the API server wait until it answers its health check. Only for a cluster started by this
        process (`from_state` does not restore command lines)."""
        process = processes.start(name, self.argv[name], self.log_dir, detached=self._detached)
        self.processes[name] = process
        self.pids[name] = process.pid
        if name in self._health:
            url, context = self._health[name]
            _wait_healthy(self, name, url, context, timeout)

    def stop(self) -> None:
        """Stop every component, newest first so none reconnects to a dead etcd; delete the directory."""
        for name in reversed(_COMPONENTS):
            pid = self.pids.get(name)
            if pid is not None:
                processes.stop_group(pid)
        shutil.rmtree(self.directory, ignore_errors=True)

    @contextlib.contextmanager
    def temporary_namespace(self, prefix: str, timeout: float = 60.0) -> Iterator[str]:
        """A fresh namespace whose default ServiceAccount exists (pods are refused before it does),
        deleted afterwards without waiting for finalization."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.kubectl("create", "namespace", name)
        try:
            deadline = time.monotonic() + timeout
            while not self.kubectl(
                "-n",
                name,
                "get",
                "serviceaccount",
                "default",
                "--ignore-not-found",
                "-o",
                "name",
                check=False,
            ):
                if time.monotonic() > deadline:
                    raise ClusterError(f"namespace {name} has no default ServiceAccount after {timeout:.0f}s")
                time.sleep(0.3)
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=false", check=False)

    def stop_and_verify(self) -> None:
        """stop(), then fail if any component outlived it: the suite must leave no process behind."""
        pids = dict(self.pids)
        self.stop()
        survivors = [name for name, pid in pids.items() if processes.pid_alive(pid)]
        assert not survivors, f"control-plane processes still alive after teardown: {survivors}"

    def alive(self) -> dict[str, bool]:
        return {name: processes.pid_alive(pid) for name, pid in self.pids.items()}

    def save_state(self) -> Path:
        path = self.directory / "state.json"
        state = {"bin_dir": str(self.bin_dir), "api_port": self.api_port, "pids": self.pids}
        path.write_text(json.dumps(state, indent=2))
        return path

    @classmethod
    def from_state(cls, directory: Path) -> Cluster:
        state = json.loads((directory / "state.json").read_text())
        return cls(
            directory=directory,
            bin_dir=Path(state["bin_dir"]),
            kubeconfig=directory / "kubeconfig",
            api_port=state["api_port"],
            pids={name: int(pid) for name, pid in state["pids"].items()},
        )


def _kubeconfig(server: str, keys: pki.ClusterPki) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kubetrain-test",
                "cluster": {"server": server, "certificate-authority": str(keys.ca_cert)},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate": str(keys.admin_cert), "client-key": str(keys.admin_key)},
            }
        ],
        "contexts": [{"name": "kubetrain-test", "context": {"cluster": "kubetrain-test", "user": "admin"}}],
        "current-context": "kubetrain-test",
    }


def _wait_healthy(
    cluster: Cluster, name: str, url: str, context: ssl.SSLContext | None, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    last_error = ""
    while time.monotonic() < deadline:
        process = cluster.processes.get(name)
        if process is not None and process.poll() is not None:
            raise ClusterError(
                f"{name} exited with code {process.returncode}; see {cluster.log_dir / (name + '.log')}"
            )
        try:
            with urllib.request.urlopen(url, context=context, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError) as error:
            last_error = str(error)
        time.sleep(0.2)
    raise ClusterError(
        f"{name} not healthy at {url} after {timeout:.0f}s ({last_error}); "
        f"see {cluster.log_dir / (name + '.log')}"
    )


def start_cluster(
    *,
    nodes: int = 3,
    detached: bool = False,
    directory: Path | None = None,
    timeout: float = 120.0,
    extra_args: dict[str, list[str]] | None = None,
    sandbox: Sandbox | None = None,
    workload_api: bool = True,
    control_plane: Path | None = None,
) -> Cluster:
    """Start a control plane with `nodes` Ready kwok nodes. On any failure everything started is stopped.

    `extra_args` appends flags to a component's command line, e.g. a benchmark raising the controller
    manager's client QPS: {"kube-controller-manager": ["--kube-api-qps=200"]}. `workload_api` serves
    scheduling.k8s.io/v1beta1 Workload and PodGroup and turns on the scheduler's gang scheduling (the
    GenericWorkload gate); False gives a cluster as 1.37 ships by default, for comparisons.
    `control_plane` is a directory holding another version's kube-apiserver, kube-controller-manager and
    kube-scheduler (`binaries.ensure_oldest_control_plane`), run with the same etcd and kwok (pass
    workload_api=False with one older than the GenericWorkload gate).
    """
    bin_dir = binaries.ensure_binaries()
    root = directory or Path(tempfile.mkdtemp(prefix="kubetrain-cluster-"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "logs").mkdir(exist_ok=True)
    keys = pki.create_pki(root / "pki")
    # Inside a sandbox the namespace is ours alone, so the ports are the well-known ones.
    api_port = _SANDBOX_API_PORT if sandbox else processes.free_port()
    cluster = Cluster(directory=root, bin_dir=bin_dir, kubeconfig=root / "kubeconfig", api_port=api_port)
    cluster._detached = detached
    cluster.kubeconfig.write_text(yaml.safe_dump(_kubeconfig(cluster.server, keys)))
    # The kubeconfig of the components themselves: inside the sandbox, the API server's own port.
    components_kubeconfig = cluster.kubeconfig
    if sandbox:
        components_kubeconfig = cluster.inner_kubeconfig = root / "kubeconfig-inner"
        components_kubeconfig.write_text(
            yaml.safe_dump(_kubeconfig(f"https://127.0.0.1:{_SANDBOX_API_PORT}", keys))
        )

    def launch(name: str, argv: list[str]) -> None:
        home = control_plane if control_plane is not None and name in binaries.CONTROL_PLANE else bin_dir
        command = [str(home / name), *argv, *(extra_args or {}).get(name, [])]
        cluster.argv[name] = sandbox.enter(command) if sandbox else command
        process = processes.start(name, cluster.argv[name], cluster.log_dir, detached=detached)
        cluster.processes[name] = process
        cluster.pids[name] = process.pid

    try:
        etcd_port, etcd_peer_port = (
            (2379, 2380) if sandbox else (processes.free_port(), processes.free_port())
        )
        launch(
            "etcd",
            [
                "--name=default",
                f"--data-dir={root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{etcd_peer_port}",
                "--listen-metrics-urls=",
                # Test data is disposable: skipping fsync makes etcd several times faster on shared disks.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        if not sandbox:  # inside a sandbox etcd is out of reach; the API server's readyz checks it
            cluster._health["etcd"] = (f"http://127.0.0.1:{etcd_port}/health", None)
            _wait_healthy(cluster, "etcd", f"http://127.0.0.1:{etcd_port}/health", None, timeout)

        launch(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                *(_sandboxed_apiserver_flags(keys) if sandbox else _loopback_apiserver_flags()),
                f"--secure-port={api_port}",
                f"--cert-dir={root / 'pki'}",
                f"--tls-cert-file={keys.server_cert}",
                f"--tls-private-key-file={keys.server_key}",
                f"--client-ca-file={keys.ca_cert}",
                f"--service-account-key-file={keys.service_account_pub}",
                f"--service-account-signing-key-file={keys.service_account_key}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                # On top of the defaults, as OpenShift and hardened distributions run: creating an object
                # whose ownerReference sets blockOwnerDeletion needs update on the owner's finalizers.
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
                "--allow-privileged=true",
                *((WORKLOAD_API_GATES, WORKLOAD_API_RUNTIME_CONFIG) if workload_api else ()),
                "--v=1",
            ],
        )
        if sandbox:
            relay, outer_port = start_relay(sandbox, _SANDBOX_API_PORT, cluster.log_dir)
            cluster.processes["apiserver-relay"] = relay
            cluster.pids["apiserver-relay"] = relay.pid
            cluster.api_port = outer_port
            cluster.kubeconfig.write_text(yaml.safe_dump(_kubeconfig(cluster.server, keys)))
        context = ssl.create_default_context(cafile=str(keys.ca_cert))
        context.load_cert_chain(str(keys.admin_cert), str(keys.admin_key))
        cluster._health["kube-apiserver"] = (f"{cluster.server}/readyz", context)
        _wait_healthy(cluster, "kube-apiserver", f"{cluster.server}/readyz", context, timeout)

        launch(
            "kube-controller-manager",
            [
                f"--kubeconfig={components_kubeconfig}",
                f"--authentication-kubeconfig={components_kubeconfig}",
                f"--authorization-kubeconfig={components_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={processes.free_port()}",
                "--leader-elect=false",
                f"--service-account-private-key-file={keys.service_account_key}",
                f"--root-ca-file={keys.ca_cert}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*,-node-ipam-controller",
                *((WORKLOAD_API_GATES,) if workload_api else ()),
                "--v=1",
            ],
        )
        launch(
            "kube-scheduler",
            [
                f"--kubeconfig={components_kubeconfig}",
                f"--authentication-kubeconfig={components_kubeconfig}",
                f"--authorization-kubeconfig={components_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={processes.free_port()}",
                "--leader-elect=false",
                *((WORKLOAD_API_GATES,) if workload_api else ()),
                "--v=1",
            ],
        )
        if sandbox:
            _wait_for_default_service_account(cluster, timeout)
            _raise_if_any_exited(cluster)
            return cluster
        launch(
            "kwok",
            [
                f"--kubeconfig={cluster.kubeconfig}",
                f"--config={KWOK_CONFIG}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--cidr={POD_CIDR}",
                "--node-ip=127.0.0.1",
            ],
        )
        _wait_for_default_service_account(cluster, timeout)
        if nodes:
            cluster.add_nodes(nodes)
        _raise_if_any_exited(cluster)
    except BaseException as error:
        tails = _log_tails(cluster)
        cluster.stop()
        if isinstance(error, Exception):
            raise ClusterError(f"{error}\n{tails}") from error
        raise
    if detached:
        cluster.save_state()
    return cluster


def _loopback_apiserver_flags() -> list[str]:
    # No pod ever needs the `kubernetes` Service on kwok nodes, so no endpoints are kept for it.
    return ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"]


def _sandboxed_apiserver_flags(keys: pki.ClusterPki) -> list[str]:
    """Flags for an API server inside a sandbox, serving a real node's pods and kubelet."""
    return [
        # Every address of the sandbox is private to it: loopback, the cluster address, the pod bridge.
        "--bind-address=0.0.0.0",
        f"--advertise-address={CLUSTER_IP}",
        # The `kubernetes` Service gets this API server as its endpoint, so pods reach it.
        "--endpoint-reconciler-type=lease",
        # `kubectl logs` and exec: the API server calls the kubelet at its InternalIP, never by a name
        # that the machine's own resolver would be asked about.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={keys.admin_cert}",
        f"--kubelet-client-key={keys.admin_key}",
    ]


def _log_tails(cluster: Cluster, lines: int = 15) -> str:
    """The end of every component's log, for an error message: the directory is gone after stop()."""
    parts = []
    for log in sorted(cluster.log_dir.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {log.name} ---\n" + "\n".join(tail))
    return "\n".join(parts)


def _raise_if_any_exited(cluster: Cluster) -> None:
    for name, process in cluster.processes.items():
        if process.poll() is not None:
            raise ClusterError(f"{name} exited with code {process.returncode}")


def _wait_for_default_service_account(cluster: Cluster, timeout: float) -> None:
    """Pods are refused until the controller manager has created the namespace's default ServiceAccount."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _raise_if_any_exited(cluster)
        if cluster.kubectl(
            "get", "serviceaccount", "default", "--ignore-not-found", "-o", "name", check=False
        ):
            return
        time.sleep(0.3)
    raise ClusterError(f"no default ServiceAccount after {timeout:.0f}s; see {cluster.log_dir}")
