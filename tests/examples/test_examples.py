"""Every shipped example is a valid TrainingJob, and the ones that can run here do."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubetrain_operator import api
from testcluster.cluster import Cluster
from testcluster.operator_process import install_crd

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
MANIFESTS = sorted(
    p
    for p in EXAMPLES.rglob("*.yaml")
    if [doc.get("kind") for doc in yaml.safe_load_all(p.read_text())] == ["TrainingJob"]
)


@pytest.mark.unit
def test_examples_cover_gpu_cpu_custom_script_and_queueing() -> None:
    names = {path.relative_to(EXAMPLES).as_posix() for path in MANIFESTS}
    assert {
        "cifar10-cpu.yaml",
        "cifar10-gpu.yaml",
        "custom-torchrun/trainingjob.yaml",
        "suspend-resume-queue.yaml",
    } <= names


@pytest.mark.unit
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_example_validates_against_the_models(path: Path) -> None:
    api.TrainingJob.model_validate(yaml.safe_load(path.read_text()))


@pytest.mark.cluster
def test_api_server_accepts_every_example(cluster: Cluster, namespace: str) -> None:
    install_crd(cluster)
    for path in MANIFESTS:
        result = cluster.run_kubectl("-n", namespace, "apply", "--dry-run=server", "-f", str(path))
        assert result.returncode == 0, f"{path}: {result.stderr}"


@pytest.mark.distributed
@pytest.mark.trains
def test_custom_torchrun_example_runs_four_ranks_locally(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubetrain_operator.cli",
            "run",
            "-f",
            str(EXAMPLES / "custom-torchrun" / "trainingjob.yaml"),
            "--local",
            "--mount",
            f"code={EXAMPLES / 'custom-torchrun'}",
            "--mount",
            f"output={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    result = json.loads((tmp_path / "custom-torchrun" / "result.json").read_text())
    assert result["world_size"] == 4, "2 workers x nprocPerWorker 2 under torchrun"
    assert result["loss"] < 0.5, "the group fitted y = 3x + 1 together (an untrained model scores above 4)"


def _read_only_data(manifest: dict[str, Any]) -> tuple[str, str, str] | None:
    """(claim, the job's mount path of it, trainer data.root) when the built-in trainer reads its data from
    a read-only claim, which the user must fill before the job can run."""
    spec = manifest["spec"]
    root = ((spec.get("trainer") or {}).get("data") or {}).get("root")
    for volume in spec.get("storage") or ():
        claim = volume.get("persistentVolumeClaim") or {}
        if root and claim.get("readOnly") and (root + "/").startswith(volume["mountPath"].rstrip("/") + "/"):
            return claim["claimName"], volume["mountPath"], root
    return None


READ_ONLY_DATA = [p for p in MANIFESTS if _read_only_data(yaml.safe_load(p.read_text()))]
LOADER_FILE = EXAMPLES / "quickstart-storage.yaml"


def _header_commands(path: Path) -> list[str]:
    """The shell commands of a file's header comments (`#   kubectl ...`, `#   #   kubectl ...` for an
    alternative), in order."""
    commands = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        command = re.sub(r"^#\s+(?:#\s+)?", "", line)
        if command.startswith(("kubectl ", "tar ")):
            commands.append(command)
    return commands


def _filled_by(command: str, loader_mount: str, local: Path) -> Path | None:
    """Run a header's `kubectl exec` step here, the loader pod's mount being the directory `local`:
    mkdir and the tar of the committed sample are run for real; torchvision's download is not (no
    network), only where it would write is returned. Returns the directory the step fills, if any."""
    match = re.match(r"kubectl exec (?:-i )?(\S+) -- (.*)$", command)
    if not match:
        return None
    download = re.search(r"torchvision\.datasets\.CIFAR10\('([^']+)', download=True\)", match.group(2))
    if download:
        return Path(download.group(1))
    argv, _, stdin = match.group(2).partition(" < ")
    args = [
        arg.replace(loader_mount, str(local), 1) if arg.startswith(loader_mount) else arg
        for arg in shlex.split(argv)
    ]
    if args[0] == "mkdir":
        subprocess.run(args, check=True)
        return None
    assert args[:2] == ["tar", "xzf"], command
    with (REPO_ROOT / stdin.strip()).open("rb") as archive:
        subprocess.run(args, stdin=archive, check=True)
    return Path(args[args.index("-C") + 1])


@pytest.mark.unit
@pytest.mark.parametrize("path", READ_ONLY_DATA, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_an_example_reading_a_read_only_claim_says_how_to_fill_it(path: Path, tmp_path: Path) -> None:
    """An example whose trainer reads data.root from a read-only claim names, in its header (or, for the
    quickstart's job, in the README's quickstart), commands that make that claim with the loader pod of
    examples/quickstart-storage.yaml and put a data set where data.root points: the committed sample's
    tar is run here for real into the loader's mount, and must leave the `<root>/train/<class>/` tree
    the trainer reads; a torchvision download must write to data.root itself."""
    claim, job_mount, root = _read_only_data(yaml.safe_load(path.read_text()))  # type: ignore[misc]
    loader_objects = list(yaml.safe_load_all(LOADER_FILE.read_text()))
    assert claim in {o["metadata"]["name"] for o in loader_objects if o["kind"] == "PersistentVolumeClaim"}
    (loader,) = [o for o in loader_objects if o["kind"] == "Pod"]
    volume = next(
        v["name"] for v in loader["spec"]["volumes"] if v["persistentVolumeClaim"]["claimName"] == claim
    )
    loader_mount = next(
        m["mountPath"] for m in loader["spec"]["containers"][0]["volumeMounts"] if m["name"] == volume
    )
    commands = _header_commands(path)
    if not commands:  # the quickstart's own job: its commands are the README's
        readme = (REPO_ROOT / "README.md").read_text()
        block = (
            readme.split("\n## Quickstart on a cluster\n", 1)[1].split("```sh\n", 1)[1].split("\n```", 1)[0]
        )
        commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    loader_file = f"-f {LOADER_FILE.relative_to(REPO_ROOT)}"
    assert any(c.startswith("kubectl apply ") and loader_file in c for c in commands), (
        "the claims and the loader"
    )
    assert f"kubectl delete pod {loader['metadata']['name']}" in commands, "the loader pod is deleted after"
    wanted = root.replace(job_mount.rstrip("/"), loader_mount.rstrip("/"), 1)
    local = tmp_path / "claim"
    local.mkdir()
    filled = [
        target for command in commands if (target := _filled_by(command, loader_mount, local)) is not None
    ]
    assert filled, f"{path.name}: no command fills the claim"
    for target in filled:
        if target.is_relative_to(local):  # the sample's tar, run here
            written = local / Path(wanted).relative_to(loader_mount)
            assert (written / "train").is_dir(), f"{path.name}: the tar does not leave {wanted}/train/"
            classes = sorted(p.name for p in (written / "train").iterdir())
            assert len(classes) == 10 and all(any((written / "train" / c).glob("*.jpg")) for c in classes), (
                f"{path.name}: the tar does not leave {wanted}/train/<class>/*.jpg"
            )
        else:
            assert str(target) == wanted, f"{path.name}: the download writes {target}, the job reads {wanted}"
