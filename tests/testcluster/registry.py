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

import socket
import subprocess
import sys
from collections.abc import Callable
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
PUSHED = binaries.CACHE_ROOT / "registry-pushed"
"""What this project pushed into `STORAGE`: one file per local image ID, holding the manifest digest the
push made (`_push` skips an image whose tag in the storage still names that digest)."""
CHART_DIR = binaries.REPO_ROOT / "charts" / "kubetrain"
CHART = f"oci://{ADDRESS}/charts/{CHART_DIR.name}"
"""Where `push_chart` puts the chart: `helm install <release> CHART --version <its version> --plain-http`."""
PODMAN = binaries.REPO_ROOT / "hack" / "podman"


class RegistryError(RuntimeError):
    """A push to the registry failed; the message carries the pusher's output."""


def repository(reference: str) -> str:
    """The repository and tag `reference` is stored under: its name without the host, for a ghcr.io name
    (what the mirror asks for) and for one named by the registry's address alike."""
    for host in (MIRRORED, ADDRESS):
        if reference.startswith(f"{host}/"):
            return reference.removeprefix(f"{host}/")
    raise ValueError(f"{reference}: neither a {MIRRORED} image nor one named by the registry ({ADDRESS})")


def path_in_registry(reference: str) -> str:
    """Where `reference` lives in this registry (`repository`, on `ADDRESS`)."""
    return f"{ADDRESS}/{repository(reference)}"


def stored_digest(reference: str) -> str | None:
    """The manifest digest `reference`'s tag names in `STORAGE` (Distribution's filesystem layout), or None
    where the storage lacks the tag."""
    name, tag = repository(reference).rsplit(":", 1)
    link = STORAGE / "docker/registry/v2/repositories" / name / "_manifests/tags" / tag / "current/link"
    return link.read_text().strip() if link.is_file() else None


def image_id(reference: str) -> str:
    """The local build's image ID in the project's podman storage: what `PUSHED` records pushes by."""
    result = subprocess.run(
        [str(PODMAN), "image", "inspect", "--format", "{{.Id}}", reference],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RegistryError(f"{reference} is not in the project's podman storage:\n{result.stderr}")
    return result.stdout.strip()


def already_stored(reference: str, build: str | None = None) -> str | None:
    """The digest `reference` was pushed as, when this very build (its image ID, `build` where the caller
    has it) was pushed and the storage's tag still names that push; None when it must be pushed."""
    record = PUSHED / (build or image_id(reference))
    if not record.is_file():
        return None
    digest = record.read_text().strip()
    return digest if stored_digest(reference) == digest else None


def _push(
    reference: str, destination: str, digest_file: Path, enter: Callable[[list[str]], list[str]]
) -> str:
    """`hack/podman push` of `reference` to `destination` (plain HTTP), run through `enter`, unless this
    build is stored already (`already_stored`); returns the manifest's digest.

    Layers go zstd-compressed rather than podman's default gzip, which is slower to compress and to
    decompress, for the trainer's 6 GB (its first push took 150 s on 2 loaded cores; gzip was not timed
    here); containerd 1.6 reads zstd layers. But podman 4.3 compresses every layer again on each push with
    an explicit compression format, to learn digests the registry may already hold: 58-62 s for the
    trainer with nothing new to send. Hence the skip: a build is pushed once."""
    build = image_id(reference)
    held = already_stored(reference, build)
    if held is not None:
        return held
    result = subprocess.run(
        enter(
            [str(PODMAN), "push", "--tls-verify=false", "--compression-format=zstd", "--quiet",
             f"--digestfile={digest_file}", reference, f"docker://{destination}"]
        ),
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RegistryError(f"pushing {reference} failed:\n{result.stdout}{result.stderr}")
    digest = digest_file.read_text().strip()
    PUSHED.mkdir(parents=True, exist_ok=True)
    (PUSHED / build).write_text(digest + "\n")
    return digest


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
        """Push `reference` from the project's podman storage to `path_in_registry(reference)`, from inside
        the sandbox where the registry's address is; return the manifest's digest."""
        return _push(reference, path_in_registry(reference), self.directory / "digest", self.sandbox.enter)

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


def _config(directory: Path, address: str) -> Path:
    config = directory / "config.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn", "formatter": "text"},
                "storage": {"filesystem": {"rootdirectory": str(STORAGE)}},
                "http": {"addr": address},
            }
        )
    )
    return config


def _wait_until_answering(process: subprocess.Popen[bytes], probe: list[str], log: Path) -> None:
    def answers() -> bool:
        if process.poll() is not None:
            raise RegistryError(f"the registry exited; see {log}")
        return subprocess.run(probe, capture_output=True, check=False).returncode == 0

    try:
        wait_for(answers, "the registry to answer", 30, interval=0.5)
    except BaseException:
        processes.stop_group(process.pid, grace_seconds=3.0)
        raise


def _probe(address: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        f"import urllib.request; urllib.request.urlopen('http://{address}/v2/', timeout=2)",
    ]


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def push_to_storage(references: list[str], work_dir: Path) -> dict[str, str]:
    """Push `references` from the project's podman storage into the registry's storage (`STORAGE`) with no
    cluster running: `make node-images` (part of `make test`) does this after building them. A registry of
    the same storage is started for the pushes on a free loopback port and stopped after. The test
    cluster's registry serves that storage, so its node finds the images there, and the fixture's own push
    (`Registry.push_image`) finds them stored and sends nothing. Builds already stored start nothing.
    Returns each reference's digest."""
    digests = {reference: already_stored(reference) for reference in references}
    missing = [reference for reference, digest in digests.items() if digest is None]
    if not missing:
        return {reference: digest for reference, digest in digests.items() if digest is not None}
    binary = binaries.ensure_registry()
    STORAGE.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{_free_loopback_port()}"
    argv = [str(binary), "serve", str(_config(work_dir, address))]
    process = processes.start("registry", argv, work_dir, detached=False)
    _wait_until_answering(process, _probe(address), work_dir / "registry.log")
    try:
        pushed = {
            reference: _push(
                reference, f"{address}/{repository(reference)}", work_dir / "digest", lambda argv: argv
            )
            for reference in missing
        }
    finally:
        processes.stop_group(process.pid, grace_seconds=3.0)
    return {reference: digests[reference] or pushed[reference] for reference in references}


def start_registry(sandbox: Sandbox, directory: Path, log_dir: Path) -> Registry:
    """Start the registry inside `sandbox` on `ADDRESS`; return once it answers the registry API."""
    binary = binaries.ensure_registry()
    STORAGE.mkdir(parents=True, exist_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    argv = sandbox.enter([str(binary), "serve", str(_config(directory, ADDRESS))])
    registry = Registry(
        sandbox=sandbox,
        process=processes.start("registry", argv, log_dir, detached=False),
        directory=directory,
    )
    _wait_until_answering(registry.process, sandbox.enter(_probe(ADDRESS)), log_dir / "registry.log")
    return registry
