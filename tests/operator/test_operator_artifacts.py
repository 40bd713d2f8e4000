"""`kubetrain artifacts`, its pure half and its stream: the job reference and flags, the refusals naming
the field that decides, the helper pod's manifest (restricted Pod Security, the claim read-only), the
packer the pod runs, and the exec's stdout unpacked into the user's directory."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import types
from pathlib import Path
from typing import Any

import pytest
from kubetrain_operator import cli
from kubetrain_operator.api import constants
from kubetrain_operator.remote import copying, outputs

pytestmark = pytest.mark.unit


def _job(phase: str | None = "Succeeded", **spec: Any) -> dict[str, Any]:
    spec.setdefault("trainer", {"output_dir": "/output"})
    spec.setdefault(
        "storage",
        [
            {"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "cifar10-data"}},
            {"name": "output", "mountPath": "/output", "persistentVolumeClaim": {"claimName": "runs"}},
        ],
    )
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "cifar", "namespace": "team", "uid": "u-1"},
        "spec": spec,
        "status": {"phase": phase} if phase else {},
    }


@pytest.mark.parametrize(
    ("reference", "name"),
    [
        ("tj/cifar", "cifar"),
        ("cifar", "cifar"),
        ("trainingjob/a.b", "a.b"),
        ("trainingjobs.kubetrain.io/x", "x"),
    ],
)
def test_a_job_is_named_as_kubectl_names_it(reference: str, name: str) -> None:
    assert outputs.job_name(reference) == name


@pytest.mark.parametrize("reference", ["pod/cifar", "tj/", "tj/Cifar", "tj/a/b", ""])
def test_anything_else_is_not_a_job_reference(reference: str) -> None:
    with pytest.raises(ValueError, match="tj/NAME"):
        outputs.job_name(reference)


def test_the_command_line_reaches_the_copy_with_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(copying, "copy", lambda *args, **kwargs: seen.append((args, kwargs)) or 0)
    assert cli.main(["artifacts", "tj/cifar", "-n", "team", "--to", "out", "--checkpoints"]) == 0
    assert seen == [
        (
            ("tj/cifar", Path("out")),
            {
                "namespace": "team",
                "checkpoints": True,
                "unfinished": False,
                "image": None,
                "start_timeout": 300.0,
            },
        )
    ]


def test_the_destination_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["artifacts", "tj/cifar"])
    assert exited.value.code == 2
    assert "--to" in capsys.readouterr().err


@pytest.mark.parametrize("phase", ["Pending", "Running", "Restarting", "Suspended", None])
def test_an_unfinished_job_is_refused_naming_the_phase_and_the_flag(phase: str | None) -> None:
    with pytest.raises(outputs.RefusedError) as refused:
        outputs.check_finished(_job(phase), unfinished=False)
    assert f"is {phase or 'Pending'} (status.phase), not finished" in str(refused.value)
    assert "--unfinished" in str(refused.value)
    outputs.check_finished(_job(phase), unfinished=True)


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_job_is_copied_from(phase: str) -> None:
    outputs.check_finished(_job(phase), unfinished=False)


def test_the_output_dir_is_found_on_the_deepest_claim_that_holds_it() -> None:
    job = _job(
        trainer={"output_dir": "/mnt/runs/team/"},
        storage=[
            {"name": "all", "mountPath": "/mnt", "persistentVolumeClaim": {"claimName": "big"}},
            {
                "name": "runs",
                "mountPath": "/mnt/runs",
                "subPath": "kubetrain",
                "persistentVolumeClaim": {"claimName": "runs"},
            },
            {"name": "runs2", "mountPath": "/mnt/runs2", "persistentVolumeClaim": {"claimName": "other"}},
        ],
    )
    location = outputs.locate(job)
    assert (location.claim, location.sub_path, location.directory) == ("runs", "kubetrain", "team/cifar")
    assert location.in_pod == "/volume/team/cifar"
    assert location.described == "kubetrain/team/cifar/ on claim runs"


def test_the_trainers_default_output_dir_is_used_when_the_spec_names_none() -> None:
    assert outputs.locate(_job(trainer={})).directory == "cifar"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"trainer": None, "command": ["python", "train.py"]}, "spec.command"),
        (
            {"storage": []},
            "spec.trainer.output_dir /output is on none of its spec.storage volumes (mountPaths: none)",
        ),
        (
            {"trainer": {"output_dir": "/outputs"}},
            "/outputs is on none of its spec.storage volumes (mountPaths: /data, /output)",
        ),
        ({"trainer": {"output_dir": "output"}}, "output is on none of its spec.storage volumes"),
        (
            {"storage": [{"name": "scratch", "mountPath": "/output", "emptyDir": {}}]},
            "spec.storage[0] (scratch), an emptyDir, gone with the worker pods",
        ),
        (
            {"storage": [{"name": "node", "mountPath": "/output", "hostPath": {"path": "/srv"}}]},
            "spec.storage[0] (node), a hostPath, on one node: kubetrain artifacts copies only from a "
            "spec.storage[0].persistentVolumeClaim",
        ),
    ],
)
def test_a_job_whose_output_kubetrain_cannot_reach_is_refused_naming_the_field(
    spec: dict[str, Any], says: str
) -> None:
    job = _job(**spec)
    if spec.get("trainer", {}) is None:
        del job["spec"]["trainer"]
    with pytest.raises(outputs.RefusedError) as refused:
        outputs.locate(job)
    assert says in str(refused.value)


def test_the_helper_pod_passes_restricted_and_mounts_only_the_claim_read_only() -> None:
    job = _job(
        image="registry.example/train:1", imagePullSecrets=[{"name": "pull"}], imagePullPolicy="Always"
    )
    job["spec"]["storage"][1]["subPath"] = "runs"
    pod = outputs.helper_pod(job, outputs.locate(job), name="cifar-artifacts-abc123", image="img:1")
    spec = pod["spec"]
    container = spec["containers"][0]
    assert pod["metadata"]["name"] == "cifar-artifacts-abc123" and pod["metadata"]["namespace"] == "team"
    assert constants.LABEL_JOB_NAME not in pod["metadata"]["labels"], (
        "the operator must not take it for a worker"
    )
    assert pod["metadata"]["labels"][outputs.LABEL_ARTIFACTS_OF] == "cifar"
    assert pod["metadata"]["ownerReferences"] == [
        {"apiVersion": constants.API_VERSION, "kind": constants.KIND, "name": "cifar", "uid": "u-1"}
    ]
    assert spec["volumes"] == [
        {"name": "output", "persistentVolumeClaim": {"claimName": "runs", "readOnly": True}}
    ]
    assert container["volumeMounts"] == [
        {"name": "output", "mountPath": "/volume", "readOnly": True, "subPath": "runs"}
    ]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["image"] == "img:1" and container["imagePullPolicy"] == "Always"
    assert spec["imagePullSecrets"] == [{"name": "pull"}]
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == outputs.POD_LIFETIME_SECONDS
    assert container["command"][-1] == str(outputs.POD_LIFETIME_SECONDS)


def test_the_helper_runs_the_flag_image_else_the_jobs_else_the_trainer_image() -> None:
    assert outputs.helper_image(_job(image="mine:2"), "flag:3") == "flag:3"
    assert outputs.helper_image(_job(image="mine:2"), None) == "mine:2"
    assert outputs.helper_image(_job(), None) == constants.TRAINER_IMAGE


def test_the_helper_pods_name_is_a_short_dns_label() -> None:
    name = outputs.pod_name("a" * 39 + "-" + "b" * 200, "abc123")
    assert name == "a" * 39 + "-artifacts-abc123" and len(name) <= 63


def _job_directory(root: Path) -> Path:
    job = root / "cifar"
    (job / "checkpoints").mkdir(parents=True)
    (job / "model.pt").write_bytes(b"model" * 1000)
    (job / "metrics.json").write_text("{}")
    (job / ".metrics.json.x1.tmp").write_text("half")
    (job / "checkpoints" / "attempt-0000-epoch-000001-step-0000000010.pt").write_bytes(b"ckpt")
    (job / "checkpoints" / ".attempt-0000.pt.y2.tmp").write_bytes(b"half")
    return job


def _pack(monkeypatch: pytest.MonkeyPatch, job: Path, checkpoints: bool) -> bytes:
    """Run the packer's program here as the pod runs it (argv from pack_command), its stdout captured."""
    location = outputs.Location(
        claim="runs", sub_path=None, directory="cifar", field="spec.storage[1]", output_dir="/output"
    )
    argv = outputs.pack_command(location, checkpoints=checkpoints)
    assert argv[:2] == ["python3", "-c"] and argv[3] == "/volume/cifar"
    out = types.SimpleNamespace(buffer=io.BytesIO())
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "argv", ["-c", str(job), *argv[4:]])
    exec(compile(argv[2], "<pack>", "exec"), {})
    return out.buffer.getvalue()


@pytest.mark.parametrize("checkpoints", [False, True])
def test_the_packer_leaves_out_checkpoints_unless_asked_and_writes_in_flight(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, checkpoints: bool
) -> None:
    data = _pack(monkeypatch, _job_directory(tmp_path), checkpoints)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        names = sorted(archive.getnames())
    expected = ["metrics.json", "model.pt"]
    if checkpoints:
        expected += ["checkpoints", "checkpoints/attempt-0000-epoch-000001-step-0000000010.pt"]
    assert names == sorted(expected)


def test_the_packer_skips_a_file_deleted_after_it_was_listed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A running job prunes old checkpoints while the packer walks its directory."""
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: [*listdir(path), "pruned.pt"])
    data = _pack(monkeypatch, _job_directory(tmp_path), checkpoints=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        names = sorted(archive.getnames())
    assert names == [
        "checkpoints",
        "checkpoints/attempt-0000-epoch-000001-step-0000000010.pt",
        "metrics.json",
        "model.pt",
    ]


def test_the_packer_says_when_the_job_wrote_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        _pack(monkeypatch, tmp_path / "missing", False)
    assert (
        exited.value.code
        == "no directory cifar/ on claim runs on the volume: the job has written nothing there"
    )


class _Socket:
    """The exec websocket as copying reads it: channel frames arriving a few at a time, then closed."""

    def __init__(self, frames: list[tuple[int, bytes]]) -> None:
        self._frames = list(frames)
        self._channels: dict[int, bytes] = {}

    def update(self, timeout: float = 0) -> None:
        if self._frames:
            channel, data = self._frames.pop(0)
            self._channels[channel] = self._channels.get(channel, b"") + data

    def is_open(self) -> bool:
        return bool(self._frames)

    def read_channel(self, channel: int, timeout: float = 0) -> bytes:
        if channel not in self._channels:
            self.update()
        return self._channels.pop(channel, b"")


def _frames(data: bytes, status: dict[str, Any], stderr: bytes = b"") -> list[tuple[int, bytes]]:
    chunks = [(copying.STDOUT, data[i : i + 3000]) for i in range(0, len(data), 3000)]
    return [*chunks, (copying.STDERR, stderr), (copying.ERROR, json.dumps(status).encode())]


SUCCESS = {"status": "Success"}
FAILURE = {
    "status": "Failure",
    "reason": "NonZeroExitCode",
    "message": "command terminated with non-zero exit code",
}


def test_the_stream_is_unpacked_whole_and_replaces_its_namesakes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = _pack(monkeypatch, _job_directory(tmp_path / "volume"), checkpoints=True)
    staging, target = tmp_path / "staging", tmp_path / "target"
    staging.mkdir()
    (target / "checkpoints").mkdir(parents=True)
    (target / "checkpoints" / "old.pt").write_bytes(b"old")
    (target / "model.pt").write_bytes(b"old")
    (target / "notes.txt").write_text("mine")
    stdout = copying.ExecStdout(_Socket(_frames(data, SUCCESS)))
    copying._unpack(stdout, staging)
    assert stdout.received == len(data)
    assert copying._move_into(staging, target) == ["checkpoints", "metrics.json", "model.pt"]
    assert (target / "model.pt").read_bytes() == b"model" * 1000
    assert sorted(p.name for p in (target / "checkpoints").iterdir()) == [
        "attempt-0000-epoch-000001-step-0000000010.pt"
    ]
    assert (target / "notes.txt").read_text() == "mine"


def test_a_failed_packer_is_reported_with_its_own_words(tmp_path: Path) -> None:
    stderr = b"no directory cifar/ on claim runs on the volume: the job has written nothing there\n"
    with pytest.raises(copying.CopyError, match="no directory cifar/ on claim runs"):
        copying._unpack(copying.ExecStdout(_Socket(_frames(b"", FAILURE, stderr))), tmp_path)


def test_a_stream_cut_short_fails_the_copy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = _pack(monkeypatch, _job_directory(tmp_path / "volume"), checkpoints=False)
    with pytest.raises(copying.CopyError):
        copying._unpack(copying.ExecStdout(_Socket(_frames(data[:1500], FAILURE))), tmp_path / "staging")


def test_a_whole_tar_from_a_packer_that_then_failed_is_not_taken(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = _pack(monkeypatch, _job_directory(tmp_path / "volume"), checkpoints=False)
    (tmp_path / "staging").mkdir()
    with pytest.raises(copying.CopyError, match="disk error"):
        copying._unpack(
            copying.ExecStdout(_Socket(_frames(data, FAILURE, b"disk error"))), tmp_path / "staging"
        )


def test_a_pod_that_cannot_pull_its_image_names_the_flag() -> None:
    pod = {
        "status": {
            "phase": "Pending",
            "containerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}],
        }
    }
    problem = copying._pod_problem(pod)
    assert problem is not None and "ErrImagePull" in problem and "--image" in problem
    assert copying._pod_problem({"status": {"phase": "Pending"}}) is None
