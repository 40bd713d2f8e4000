"""A private network and mount namespace that holds a whole real-node cluster.

The real node's pods need addresses, a bridge, iptables rules and a DNS server, and every packet must stay
on this machine. So the control plane and the node run inside one network namespace of our own: its only
interfaces are loopback, which also carries the cluster's address (`CLUSTER_IP`: API server, kubelet,
cluster DNS), and the CNI bridge the pods hang off. Nothing in it is routed anywhere else. The
tests, outside, reach the API server through a relay on the machine's loopback (`socat`, one connection
into the namespace per connection accepted).

The same namespace has a mount namespace of its own in which the cgroup2 mount at
/sys/fs/cgroup/unified is unmounted: runc and the kubelet refuse this machine's "hybrid" cgroup layout
otherwise. The machine's own mounts are never touched. Kubelet and containerd must share this mount
namespace: the volumes the kubelet mounts for a pod (tmpfs for tokens, bind mounts) must be visible to
the runtime that starts its containers.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from testcluster import processes

CLUSTER_IP = "10.213.0.1"
"""The cluster's address inside the namespace (on its loopback): API server, kubelet, CoreDNS."""
POD_SUBNET = "10.214.0.0/24"
"""Pod addresses on the CNI bridge inside the namespace."""

_SETUP = f"""
set -e
if mountpoint -q /sys/fs/cgroup/unified; then umount /sys/fs/cgroup/unified; fi
ip link set lo up
# On loopback (this kernel has no dummy links): still local to every interface of the namespace, so pods
# on the bridge reach it through their gateway.
ip addr add {CLUSTER_IP}/32 dev lo
# Pod -> Service -> pod traffic is routed back out of the bridge; nothing leaves the namespace.
sysctl -qw net.ipv4.ip_forward=1
echo ready
exec sleep infinity
"""


class SandboxError(RuntimeError):
    """The namespace could not be made (not root, no unshare, no iproute2)."""


@dataclass
class Sandbox:
    """The holder process whose namespaces every cluster process joins; it lives until `stop()`."""

    holder: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.holder.pid

    def enter(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the sandbox's network and mount namespaces."""
        return ["nsenter", f"--target={self.pid}", "--mount", "--net", "--", *argv]

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60.0) -> str:
        result = subprocess.run(
            self.enter(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise SandboxError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
        return result.stdout

    def members(self) -> list[int]:
        """Every process in the sandbox's network namespace but the holder (containerd's shims and the
        containers they started included: they are not our children, so only the namespace finds them)."""
        own = Path(f"/proc/{self.pid}/ns/net").readlink()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.pid:
                continue
            try:
                if (entry / "ns" / "net").readlink() == own:
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def stop(self) -> None:
        """SIGKILL everything left in the namespace, then the holder; the namespace and its bridge, routes
        and iptables rules vanish with the last process."""
        if self.holder.poll() is None:
            processes.kill_until_gone(self.members)
            processes.stop_group(self.pid, grace_seconds=1.0)
        self.holder.wait(timeout=10)


def start_sandbox(log_dir: Path) -> Sandbox:
    """Make the namespaces; fail with the reason if this machine cannot (e.g. not root)."""
    if os.geteuid() != 0:
        raise SandboxError("a real node needs root (network namespaces, mounts, iptables)")
    log = (log_dir / "sandbox.log").open("ab")
    holder = subprocess.Popen(
        ["unshare", "--mount", "--net", "--propagation", "private", "--", "/bin/sh", "-c", _SETUP],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=processes.die_with_parent,  # noqa: PLW1509 - only calls prctl
    )
    log.close()
    assert holder.stdout is not None
    line = holder.stdout.readline().decode().strip()
    if line != "ready":
        holder.kill()
        holder.wait()
        raise SandboxError(f"namespace setup failed; see {log_dir / 'sandbox.log'}")
    return Sandbox(holder=holder)


def start_relay(sandbox: Sandbox, inner_port: int, log_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Relay 127.0.0.1:<free port> on the machine to 127.0.0.1:`inner_port` inside the sandbox."""
    outer_port = processes.free_port()
    # socat splits its addresses at colons, so the command for each connection lives in a script.
    inner = log_dir / "apiserver-relay-inner.sh"
    command = " ".join(sandbox.enter(["socat", "STDIO", f"TCP:127.0.0.1:{inner_port}"]))
    inner.write_text(f"#!/bin/sh\nexec {command}\n")
    inner.chmod(0o755)
    relay = processes.start(
        "apiserver-relay",
        ["socat", f"TCP-LISTEN:{outer_port},bind=127.0.0.1,reuseaddr,fork", f"EXEC:{inner}"],
        log_dir,
        detached=False,
    )
    return relay, outer_port
