"""The real-node cluster's container registry: where its node pulls the project's images and helm the
chart, as a real cluster's nodes and users pull from theirs.

Distribution's `registry` (hack/build-registry.sh) listens on the cluster's own address inside the
sandbox (`ADDRESS`, plain HTTP: nothing outside the namespace reaches it, so there is nothing to encrypt
against), with its storage in the build cache (`STORAGE`). Storage is content-addressed, so what was
pushed survives the cluster and a second push of an unchanged layer sends nothing.

The chart's images keep their ordinary names (`ghcr.io/kubetrain/...`): containerd's hosts directory
(`write_hosts`) makes this registry a mirror for ghcr.io, so `ghcr.io/kubetrain/kubetrain-trainer:0.1.0`
is pulled from `ADDRESS/kubetrain/kubetrain-trainer:0.1.0`; ghcr.io itself is out of reach. Images
without a mirrored name (the node's pause image) are named by `ADDRESS` itself. podman and helm run
inside the sandbox to reach it, so no relay is needed.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from testcluster import binaries, processes
from testcluster.cluster import Cluster
from testcluster.sandbox import CLUSTER_IP, Sandbox
from testcluster.waiting import wait_for

ADDRESS = f"{CLUSTER_IP}:5000"
MIRRORED = "ghcr.io"
"""The registry the chart's images name, served from this one."""
STORAGE = binaries.CACHE_ROOT / "registry"
CHART_DIR = binaries.REPO_ROOT / "charts" / "kubetrain"
CHART = f"oci://{ADDRESS}/charts/{CHART_DIR.name}"
"""Where `push_chart` puts the chart: `helm install <release> CHART --version <its version> --plain-http`."""
PODMAN = binaries.REPO_ROOT / "hack" / "podman"


class RegistryError(RuntimeError):
    """A push to the registry failed; the message carries the pusher's output."""


def path_in_registry(reference: str) -> str:
    """Where `reference` lives in this registry: a ghcr.io name where the mirror asks for it (the
    registry's own host in its place), a name under `ADDRESS` as it is."""
    for host in (MIRRORED, ADDRESS):
        if reference.startswith(f"{host}/"):
            return f"{ADDRESS}/{reference.removeprefix(f'{host}/')}"
    raise ValueError(f"{reference}: neither a {MIRRORED} image nor one named by the registry ({ADDRESS})")


def write_hosts(directory: Path) -> Path:
    """containerd's hosts directory (its CRI `config_path`): this registry mirrors ghcr.io and serves
    its own address, both over plain HTTP. Returns the directory.

    Each file names the registry as a `host`, its own address's too: containerd 1.6.20 refuses a
    hosts.toml with a `server` alone ("invalid `host` tree") and falls back to HTTPS."""
    for name, server in ((MIRRORED, f"https://{MIRRORED}"), (ADDRESS, f"http://{ADDRESS}")):
        hosts = directory / name / "hosts.toml"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(
            f'server = "{server}"\n\n[host."http://{ADDRESS}"]\n  capabilities = ["pull", "resolve"]\n'
        )
    return directory


def chart_version() -> str:
    """The chart's version as Chart.yaml states it: the tag `push_chart` gives it in the registry."""
    return str(yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["version"])


@dataclass
class Registry:
    """The running registry and the sandbox whose address it serves."""

    sandbox: Sandbox
    process: subprocess.Popen[bytes]
    directory: Path
    """Its configuration and the pushes' scratch files (the storage is `STORAGE`)."""

    def push_image(self, reference: str) -> str:
        """Push `reference` from the project's podman storage to `path_in_registry(reference)`; return
        the manifest's digest. Layers go zstd-compressed rather than podman's default gzip, which is
        slower to compress and to decompress, for the trainer's 6 GB (its first push took 150 s on 2
        loaded cores; gzip was not timed here); containerd 1.6 reads zstd layers."""
        digest_file = self.directory / "digest"
        result = subprocess.run(
            self.sandbox.enter(
                [str(PODMAN), "push", "--tls-verify=false", "--compression-format=zstd", "--quiet",
                 f"--digestfile={digest_file}", reference, f"docker://{path_in_registry(reference)}"]
            ),
            capture_output=True, text=True, timeout=1800, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RegistryError(f"pushing {reference} failed:\n{result.stdout}{result.stderr}")
        return digest_file.read_text().strip()

    def push_chart(self, helm: Path, work_dir: Path) -> None:
        """`helm package` the chart as it is in the tree and `helm push` it to `CHART`."""
        package = subprocess.run(
            [str(helm), "package", str(CHART_DIR), "--destination", str(work_dir)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        archive = work_dir / f"{CHART_DIR.name}-{chart_version()}.tgz"
        if package.returncode != 0 or not archive.is_file():
            raise RegistryError(f"helm package failed:\n{package.stdout}{package.stderr}")
        push = self.helm(helm, "push", str(archive), CHART.rsplit("/", 1)[0], "--plain-http")
        if push.returncode != 0:
            raise RegistryError(f"helm push failed:\n{push.stdout}{push.stderr}")

    def helm(self, helm: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
        """helm inside the sandbox, where the registry's address is."""
        return subprocess.run(
            self.sandbox.enter([str(helm), *args]),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def helm_from_chart(
        self, cluster: Cluster, verb: str, release: str, *args: str
    ) -> subprocess.CompletedProcess[str]:
        """`helm <verb> <release> CHART --version <the chart's> --plain-http <args>` against `cluster`'s
        API server (`install`, `upgrade`), as a user installs a chart from an OCI registry."""
        assert cluster.inner_kubeconfig is not None, "a registry serves a sandboxed cluster only"
        return self.helm(
            cluster.bin_dir / "helm", "--kubeconfig", str(cluster.inner_kubeconfig), verb, release, CHART,
            "--version", chart_version(), "--plain-http", *args,
        )  # fmt: skip

    def stop(self) -> None:
        processes.stop_group(self.process.pid, grace_seconds=3.0)


def _config(directory: Path) -> Path:
    config = directory / "config.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn", "formatter": "text"},
                "storage": {"filesystem": {"rootdirectory": str(STORAGE)}},
                "http": {"addr": ADDRESS},
            }
        )
    )
    return config


def start_registry(sandbox: Sandbox, directory: Path, log_dir: Path) -> Registry:
    """Start the registry inside `sandbox` on `ADDRESS`; return once it answers the registry API."""
    binary = binaries.ensure_registry()
    STORAGE.mkdir(parents=True, exist_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    argv = sandbox.enter([str(binary), "serve", str(_config(directory))])
    registry = Registry(
        sandbox=sandbox,
        process=processes.start("registry", argv, log_dir, detached=False),
        directory=directory,
    )
    probe = sandbox.enter(
        [
            sys.executable,
            "-c",
            f"import urllib.request; urllib.request.urlopen('http://{ADDRESS}/v2/', timeout=2)",
        ]
    )

    def answers() -> bool:
        if registry.process.poll() is not None:
            raise RegistryError(f"the registry exited; see {log_dir / 'registry.log'}")
        return subprocess.run(probe, capture_output=True, check=False).returncode == 0

    try:
        wait_for(answers, "the registry to answer", 30, interval=0.5)
    except BaseException:
        registry.stop()
        raise
    return registry
