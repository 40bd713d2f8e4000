"""A real Kubernetes node: containerd + runc + CNI + kubelet + kube-proxy, and CoreDNS for cluster DNS.

Everything runs inside the cluster's sandbox (see `sandbox`): the kubelet (v1.37, built like the control
plane), Debian's containerd 1.6 with its runc, Debian's CNI plugins (bridge + host-local + loopback),
kube-proxy in iptables mode (so the `kubernetes` Service reaches the API server from pods) and CoreDNS
answering `cluster.local` (so `<pod>.<service>.<namespace>.svc` resolves) and nothing else.

Images reach the node as they reach a real cluster's: the tests push what they built to the cluster's
own registry (`registry`), and containerd pulls from it, as a mirror for the chart's `ghcr.io` names, when
the kubelet asks. containerd's store lives in the build cache, so a pull fetches only the layers the node
lacks. The sandbox ("pause") image is any image whose command sleeps forever; we build one from the same
Debian base as the kubetrain images and name it by the registry's address.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testcluster import binaries, processes, registry
from testcluster.cluster import Cluster, start_cluster
from testcluster.sandbox import CLUSTER_IP, POD_SUBNET, Sandbox, start_sandbox
from testcluster.waiting import wait_for

NODE_NAME = "kubetrain-node"
PAUSE_IMAGE = f"{registry.ADDRESS}/kubetrain-pause:1"
CACHE_ROOT = binaries.CACHE_ROOT
PODMAN = binaries.REPO_ROOT / "hack" / "podman"
BUILD_IMAGES = binaries.REPO_ROOT / "hack" / "build-images.sh"
_NODE_COMPONENTS = ("containerd", "coredns", "kube-proxy", "kubelet")


class NodeError(RuntimeError):
    """A node component failed to start; the message points at its log."""


def build_images() -> list[str]:
    """Build (or find cached) the operator and trainer images; return their references."""
    result = subprocess.run(
        ["bash", str(BUILD_IMAGES)], stdout=subprocess.PIPE, text=True, check=True, timeout=3600
    )
    return result.stdout.strip().splitlines()[-2:]


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PODMAN), *args], capture_output=True, text=True, check=check)


def _ensure_pause_image() -> None:
    if _podman("image", "exists", PAUSE_IMAGE, check=False).returncode == 0:
        return
    containerfile = 'FROM docker.io/library/python:3.11.14-slim-bookworm\nCMD ["sleep", "infinity"]\n'
    subprocess.run(
        [str(PODMAN), "build", "--pull=never", "-t", PAUSE_IMAGE, "-f", "-", "."],
        input=containerfile,
        text=True,
        capture_output=True,
        check=True,
        cwd=CACHE_ROOT,
    )


@dataclass
class Node:
    """The running node's processes and where they keep their state."""

    sandbox: Sandbox
    directory: Path
    bin_dir: Path
    registry: registry.Registry
    """The cluster's registry, which the node pulls every image from."""
    pids: dict[str, int] = field(default_factory=dict)
    cgroup_root: str = ""

    @property
    def containerd_socket(self) -> Path:
        return self.directory / "containerd.sock"

    def ctr(self, *args: str, timeout: float = 1800) -> str:
        """ctr against the node's containerd, run inside the sandbox: a pull is the client's work, and
        the registry's address is there."""
        result = subprocess.run(
            self.sandbox.enter(["ctr", f"--address={self.containerd_socket}", "--namespace=k8s.io", *args]),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)}: {result.stderr.decode(errors='replace').strip()}")
        return result.stdout.decode()

    def push_image(self, reference: str) -> None:
        """Push `reference` from the project's podman storage to the registry, for the kubelet to pull.

        containerd's store outlives the node, and a rebuilt image keeps its tag, which the chart's
        IfNotPresent would never pull again: a tag the node holds at another digest is pulled anew here.
        The pull moves the tag only once the new image is complete, so the layers both builds share are
        never garbage-collected in between. An image the node lacks is left to the kubelet."""
        digest = self.registry.push_image(reference)
        held = {row.split()[0]: row.split()[2] for row in self.ctr("images", "list").splitlines()[1:]}
        if held.get(reference, digest) != digest:
            self.ctr("images", "pull", f"--hosts-dir={self.hosts_dir}", reference)

    @property
    def hosts_dir(self) -> Path:
        """containerd's registry hosts (`registry.write_hosts`): the mirror for ghcr.io."""
        return self.directory / "certs.d"

    def container_pid(self, namespace: str, pod: str, container: str) -> int:
        """The host pid of a running container's main process (for fault injection). A container the
        kubelet removes between the listing and its info (an earlier test's pod going) is skipped: the
        running one looked for is not removed."""
        for line in self.ctr("containers", "list", "--quiet").split():
            try:
                info = json.loads(self.ctr("containers", "info", line))
            except NodeError as exc:
                if "not found" in str(exc):
                    continue
                raise
            labels = info.get("Labels", {})
            if (
                labels.get("io.kubernetes.pod.namespace") == namespace
                and labels.get("io.kubernetes.pod.name") == pod
                and labels.get("io.kubernetes.container.name") == container
            ):
                task = self.ctr("tasks", "list")
                for row in task.splitlines()[1:]:
                    columns = row.split()
                    if columns and columns[0] == line and columns[2] == "RUNNING":
                        return int(columns[1])
        raise NodeError(f"no running container {container} of pod {namespace}/{pod}")

    def stop(self) -> None:
        """Stop the node's own processes; the containers and shims they leave die with the sandbox."""
        for name in reversed(_NODE_COMPONENTS):
            pid = self.pids.get(name)
            if pid is not None:
                processes.stop_group(pid, grace_seconds=3.0)


def _remove_cgroups(root: str) -> None:
    """Kill what is left in the kubelet's cgroup tree (pod containers live in network namespaces of their
    own, so the sandbox's teardown does not reach them), then rmdir the tree under every v1 controller."""
    if not root:
        return
    processes.kill_until_gone(
        lambda: {
            int(pid)
            for procs in Path("/sys/fs/cgroup/pids", root.lstrip("/")).rglob("cgroup.procs")
            for pid in procs.read_text().split()
        },
        pause=0.5,
    )
    for controller in Path("/sys/fs/cgroup").iterdir():
        tree = controller / root.lstrip("/")
        if not tree.is_dir():
            continue
        for directory in sorted(tree.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if directory.is_dir():
                with contextlib.suppress(OSError):
                    directory.rmdir()
        with contextlib.suppress(OSError):
            tree.rmdir()


def _make_cgroups(root: str) -> None:
    """The kubelet's cgroupRoot must exist under every v1 controller before it starts (it creates only
    what lies below). cpuset children start empty in v1: they get their parent's CPUs and memory nodes."""
    for controller in Path("/sys/fs/cgroup").iterdir():
        if controller.name == "unified" or not (controller / "cgroup.procs").exists():
            continue
        tree = controller / root.lstrip("/")
        tree.mkdir(exist_ok=True)
        for inherited in ("cpuset.cpus", "cpuset.mems"):
            if (tree / inherited).exists():
                (tree / inherited).write_text((controller / inherited).read_text())


def _containerd_config(directory: Path) -> str:
    cni_dir = directory / "cni"
    return f"""version = 2
root = "{CACHE_ROOT / "node" / "containerd"}"
state = "{directory / "containerd-state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{directory / "containerd.sock"}"

[ttrpc]
  address = "{directory / "containerd-ttrpc.sock"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Without it every sandbox fails on this machine kind: "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_dir}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{directory / "certs.d"}"
"""


def _cni_config(directory: Path) -> dict[str, Any]:
    return {
        "cniVersion": "0.4.0",
        "name": "kubetrain",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "kubetrain-br0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(directory / "cni-ipam"),
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def _kubelet_config(directory: Path, ca_cert: Path, cgroup_root: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine kind has cgroup v1 controllers only; v1.37 still runs on them when told to.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failSwapOn": False,
        "enforceNodeAllocatable": [],
        "containerRuntimeEndpoint": f"unix://{directory / 'containerd.sock'}",
        "address": CLUSTER_IP,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "clusterDomain": "cluster.local",
        "clusterDNS": [CLUSTER_IP],
        # Pods never see the machine's own resolver: there is nothing outside to resolve.
        "resolvConf": str(directory / "resolv.conf"),
        "podLogsDir": str(directory / "pod-logs"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        # containerd's store is the node's cache across runs: never garbage-collect it, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%"},
        "serializeImagePulls": False,
        "maxPods": 30,
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "5s",
    }


def _corefile(kubeconfig: Path) -> str:
    return f"""cluster.local:53 {{
    bind {CLUSTER_IP}
    errors
    kubernetes cluster.local in-addr.arpa {{
        kubeconfig {kubeconfig} kubetrain-test
        pods insecure
    }}
    cache 5
}}
.:53 {{
    bind {CLUSTER_IP}
    # Nothing outside this machine exists for pods: every other name is answered at once, NXDOMAIN.
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def start_node(
    sandbox: Sandbox,
    *,
    directory: Path,
    bin_dir: Path,
    kubeconfig: Path,
    ca_cert: Path,
    images: list[str],
    image_registry: registry.Registry,
) -> Node:
    """Start containerd, push the pause image and `images` to `image_registry`, start CoreDNS,
    kube-proxy and the kubelet. `kubeconfig` is the one used inside the sandbox."""
    directory.mkdir(parents=True, exist_ok=True)
    log_dir = directory / "logs"
    log_dir.mkdir(exist_ok=True)
    for sub in ("cni", "cni-ipam", "pod-logs", "kubelet", "containerd-state"):
        (directory / sub).mkdir(exist_ok=True)
    (CACHE_ROOT / "node" / "containerd").mkdir(parents=True, exist_ok=True)
    (directory / "resolv.conf").write_text(f"nameserver {CLUSTER_IP}\n")
    (directory / "containerd.toml").write_text(_containerd_config(directory))
    registry.write_hosts(directory / "certs.d")
    (directory / "cni" / "10-kubetrain.conflist").write_text(json.dumps(_cni_config(directory)))
    cgroup_root = f"/kubetrain-{uuid.uuid4().hex[:8]}"
    node = Node(
        sandbox=sandbox,
        directory=directory,
        bin_dir=bin_dir,
        registry=image_registry,
        cgroup_root=cgroup_root,
    )

    def launch(name: str, argv: list[str]) -> None:
        process = processes.start(name, sandbox.enter(argv), log_dir, detached=False)
        node.pids[name] = process.pid

    try:
        launch("containerd", ["containerd", f"--config={directory / 'containerd.toml'}"])
        containerd_log = lambda: f"see {log_dir / 'containerd.log'}"  # noqa: E731
        wait_for(node.containerd_socket.exists, "containerd's socket", explain=containerd_log)
        wait_for(lambda: _ctr_ok(node), "containerd answering", explain=containerd_log)
        _ensure_pause_image()
        for reference in [PAUSE_IMAGE, *images]:
            node.push_image(reference)

        (directory / "Corefile").write_text(_corefile(kubeconfig))
        launch("coredns", [str(bin_dir / "coredns"), "-conf", str(directory / "Corefile")])
        launch(
            "kube-proxy",
            [
                str(bin_dir / "kube-proxy"),
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                "--proxy-mode=iptables",
                f"--cluster-cidr={POD_SUBNET}",
                "--metrics-bind-address=127.0.0.1:10249",
                "--healthz-bind-address=127.0.0.1:10256",
                # kube-proxy would raise machine-wide conntrack sysctls; leave them as they are.
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0",
                "--v=1",
            ],
        )
        _make_cgroups(cgroup_root)
        (directory / "kubelet.yaml").write_text(
            yaml.safe_dump(_kubelet_config(directory, ca_cert, cgroup_root))
        )
        launch(
            "kubelet",
            [
                str(bin_dir / "kubelet"),
                f"--config={directory / 'kubelet.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={directory / 'kubelet'}",
                f"--node-ip={CLUSTER_IP}",
                f"--hostname-override={NODE_NAME}",
                "--v=1",
            ],
        )
    except BaseException:
        node.stop()
        raise
    return node


def _log_tails(log_dir: Path, lines: int = 25) -> str:
    """The end of every node component's log, for an error message: the directory is gone after teardown."""
    return "\n".join(
        f"--- {log.name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        for log in sorted(log_dir.glob("*.log"))
    )


def _ctr_ok(node: Node) -> bool:
    try:
        node.ctr("version", timeout=10)
    except (NodeError, subprocess.TimeoutExpired):
        return False
    return True


NODE_LOCK_WAIT_SECONDS = 3600
"""How long a second real node waits for the first to stop (a full e2e module takes minutes)."""


@contextlib.contextmanager
def _containerd_root_lock() -> Iterator[None]:
    """Hold the one containerd root under the build cache for this node's life. Every node keeps its
    images there (pulled once, not per test run), and two containerds on one root cannot both start:
    the second used to time out after 60 s with no word about why. Now it waits, and says for whom."""
    lock_path = CACHE_ROOT / "node" / "containerd.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "an unknown process"
            print(f"[real node] waiting for {holder} to stop its node ({lock_path})", flush=True)
            deadline = time.monotonic() + NODE_LOCK_WAIT_SECONDS
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise NodeError(
                            f"{holder} has held the real node's containerd root ({lock_path}) for over "
                            f"{NODE_LOCK_WAIT_SECONDS} s; only one real node runs on a machine at a time"
                        ) from None
                    time.sleep(2)
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} ({' '.join(sys.argv[:3])})\n")
        lock.flush()
        try:
            yield
        finally:
            lock.seek(0)
            lock.truncate()
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def real_node_cluster() -> Iterator[tuple[Cluster, Node]]:
    """A sandboxed control plane with one real node, Ready, and the cluster's registry holding the
    project's images and chart as built (the node pulls from it); everything is stopped and removed
    afterwards (processes, namespace, cgroups, files), whatever happened. One at a time per machine
    (`_containerd_root_lock`)."""
    with _containerd_root_lock():
        yield from _real_node_cluster()


def _real_node_cluster() -> Iterator[tuple[Cluster, Node]]:
    images = build_images()
    root = Path(tempfile.mkdtemp(prefix="kubetrain-node-"))
    (root / "logs").mkdir()
    sandbox = start_sandbox(root / "logs")
    cluster: Cluster | None = None
    image_registry: registry.Registry | None = None
    node: Node | None = None
    try:
        cluster = start_cluster(nodes=0, directory=root / "cluster", sandbox=sandbox)
        assert cluster.inner_kubeconfig is not None
        image_registry = registry.start_registry(sandbox, root / "registry", root / "logs")
        image_registry.push_chart(cluster.bin_dir / "helm", root / "registry")
        node = start_node(
            sandbox,
            directory=root / "node",
            bin_dir=cluster.bin_dir,
            kubeconfig=cluster.inner_kubeconfig,
            ca_cert=cluster.directory / "pki" / "ca.crt",
            images=images,
            image_registry=image_registry,
        )
        ready = '{.status.conditions[?(@.type=="Ready")].status}'
        deadline = time.monotonic() + 180
        # `kubectl wait` fails at once on a node not yet registered: poll until it is there and Ready.
        while cluster.kubectl("get", "node", NODE_NAME, "-o", f"jsonpath={ready}", check=False) != "True":
            if time.monotonic() > deadline:
                raise NodeError(
                    f"node {NODE_NAME} not Ready after 180 s:\n{_log_tails(node.directory / 'logs')}"
                )
            time.sleep(1)
        yield cluster, node
    finally:
        if node is not None:
            node.stop()
        if image_registry is not None:
            image_registry.stop()
        if cluster is not None:
            cluster.stop()
        sandbox.stop()
        if node is not None:
            _remove_cgroups(node.cgroup_root)
        shutil.rmtree(root, ignore_errors=True)
