"""`kubetrain artifacts` on a real node: the model trained by real worker containers comes off its claim
through a helper pod (restricted Pod Security, the claim read-only, a tar streamed out by the API's exec),
and `kubetrain predict` runs on the copy. The CLI runs as a user runs it: the installed `kubetrain` script
with the cluster's kubeconfig, no kubectl on its PATH.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from kubetrain_operator.remote import outputs
from testcluster import binaries, workload
from testcluster.cluster import Cluster
from testcluster.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.slow, pytest.mark.trains]

NAMESPACE = workload.NAMESPACE
KUBETRAIN = Path(sys.executable).parent / "kubetrain"
SAMPLE_IMAGE = binaries.REPO_ROOT / "examples" / "data" / "predict" / "cat" / "4980.jpg"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _kubetrain(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The `kubetrain` script with the cluster's kubeconfig and a PATH holding no kubectl."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PATH": str(KUBETRAIN.parent)}
    return subprocess.run(
        [str(KUBETRAIN), *args], capture_output=True, text=True, timeout=600, env=env, check=False
    )


def _helper_pods(cluster: Cluster, job: str) -> list[str]:
    return cluster.kubectl(
        "-n", NAMESPACE, "get", "pods", "-l", f"{outputs.LABEL_ARTIFACTS_OF}={job}", "-o", "name"
    ).split()


def _pod_named_in(stderr: str) -> str:
    """The helper pod the CLI said it copies through ("... through pod NS/NAME")."""
    line = next(line for line in stderr.splitlines() if " through pod " in line)
    return line.rsplit("/", 1)[1]


def test_a_finished_jobs_model_is_copied_off_its_claim_and_predicts_here(
    installed: Cluster, volumes: dict[str, Path], tmp_path: Path
) -> None:
    cluster = installed
    cluster.apply(workload.trainingjob("art-ddp", epochs=2))
    workload.wait_phase(cluster, "art-ddp", "Succeeded", 900)

    # What the workers (uid 1000) wrote is readable by any uid that mounts the volume.
    written = volumes["output"] / "art-ddp"
    for path in [written, *written.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), f"{path}: {oct(mode)}"

    copied = tmp_path / "copied"
    result = _kubetrain(cluster, "artifacts", "tj/art-ddp", "-n", NAMESPACE, "--to", str(copied))
    assert result.returncode == 0, result.stderr
    for name in ("model.pt", "metrics.json", "loss_curve.png", "progress.json"):
        assert (copied / name).read_bytes() == (written / name).read_bytes(), name
    assert (written / "checkpoints").is_dir() and not (copied / "checkpoints").exists(), sorted(
        p.name for p in copied.iterdir()
    )
    assert "--checkpoints" in result.stderr, result.stderr
    helper = _pod_named_in(result.stderr)
    assert cluster.run_kubectl("-n", NAMESPACE, "get", "pod", helper).returncode != 0, "the pod is gone"
    assert _helper_pods(cluster, "art-ddp") == []

    predicted = subprocess.run(
        [str(KUBETRAIN), "predict", str(copied / "model.pt"), str(SAMPLE_IMAGE), "--device", "cpu"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    line = predicted.stdout.strip().splitlines()[-1]
    assert line.startswith(f"{SAMPLE_IMAGE}: ") and line.split(", ")[1] in CLASSES, predicted.stdout


def test_an_unfinished_job_is_refused_unless_asked_and_no_failure_or_ctrl_c_leaves_a_pod(
    installed: Cluster, volumes: dict[str, Path], tmp_path: Path
) -> None:
    cluster = installed
    # Long enough to still run through every step below; the test deletes it at the end.
    cluster.apply(workload.trainingjob("art-running", epochs=60, workers=1))
    checkpoints = volumes["output"] / "art-running" / "checkpoints"

    def running_with_a_checkpoint() -> bool:
        return workload.status(cluster, "art-running").get("phase") == "Running" and any(
            checkpoints.glob("*.pt")
        )

    wait_for(
        running_with_a_checkpoint,
        "art-running running with a checkpoint",
        600,
        interval=1,
        explain=lambda: workload.story(cluster, "art-running"),
    )
    try:
        refused = _kubetrain(
            cluster, "artifacts", "tj/art-running", "-n", NAMESPACE, "--to", str(tmp_path / "a")
        )
        assert refused.returncode == 2, refused.stderr
        assert "is Running (status.phase), not finished" in refused.stderr, refused.stderr
        assert "--unfinished" in refused.stderr, refused.stderr
        assert not (tmp_path / "a").exists(), "a refusal creates nothing"

        snapshot = tmp_path / "b"
        copied = _kubetrain(
            cluster, "artifacts", "art-running", "-n", NAMESPACE, "--to", str(snapshot), "--unfinished",
            "--checkpoints",
        )  # fmt: skip
        assert copied.returncode == 0, copied.stderr
        assert (snapshot / "progress.json").is_file() and any((snapshot / "checkpoints").glob("*.pt")), (
            sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*"))
        )
        assert not list(snapshot.rglob(".*.tmp")), "writes in flight are left out"

        # Whatever happens the helper pod goes: here its image cannot be pulled.
        no_image = _kubetrain(
            cluster, "artifacts", "tj/art-running", "-n", NAMESPACE, "--to", str(tmp_path / "d"),
            "--unfinished", "--image", "registry.invalid/none:0",
        )  # fmt: skip
        assert no_image.returncode == 1, no_image.stderr
        assert "cannot run" in no_image.stderr and "--image" in no_image.stderr, no_image.stderr
        assert _helper_pods(cluster, "art-running") == []
        assert not any((tmp_path / "d").iterdir()), "a failed copy leaves nothing"

        # Ctrl-C once the CLI has named its pod: the pod is deleted all the same.
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PATH": str(KUBETRAIN.parent)}
        argv = [str(KUBETRAIN), "artifacts", "tj/art-running", "-n", NAMESPACE, "--unfinished"]
        with subprocess.Popen(
            [*argv, "--checkpoints", "--to", str(tmp_path / "c")], stderr=subprocess.PIPE, text=True, env=env
        ) as process:
            assert process.stderr is not None
            first = process.stderr.readline()
            assert " through pod " in first, first
            process.send_signal(signal.SIGINT)
            rest = process.stderr.read()
            assert process.wait(timeout=120) == 130, first + rest
        assert "interrupted" in rest, rest
        assert _helper_pods(cluster, "art-running") == [], first + rest
        assert not any((tmp_path / "c").iterdir()), "an interrupted copy leaves nothing"
    finally:
        cluster.kubectl("-n", NAMESPACE, "delete", "tj", "art-running", "--wait=false")
