"""Local mode renders workers with the operator's builders and translates only what a pod has and a host has not."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from kubetrain_operator import api
from kubetrain_operator.local import processes

pytestmark = pytest.mark.unit


def _job(spec: dict) -> api.TrainingJob:
    return api.TrainingJob.model_validate(
        {
            "apiVersion": "kubetrain.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "demo"},
            "spec": spec,
        }
    )


TRAINER_SPEC = {
    "workers": 3,
    "trainer": {"epochs": 1, "data": {"dataset": "fake", "root": "/data/set"}, "output_dir": "/output"},
    "storage": [
        {"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "d"}},
        {"name": "output", "mountPath": "/output", "emptyDir": {}},
    ],
}


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_every_rank_gets_the_operator_env_with_the_master_on_loopback(tmp_path: Path, rank: int) -> None:
    job = _job(TRAINER_SPEC)
    directories = processes.mount_directories(job.spec, {}, tmp_path)
    worker = processes.plan_local_workers(job, directories, master_port=4321)[rank]
    assert worker.env["MASTER_ADDR"] == worker.env["PET_MASTER_ADDR"] == "127.0.0.1"
    assert worker.env["MASTER_PORT"] == worker.env["PET_MASTER_PORT"] == "4321"
    assert worker.env["WORLD_SIZE"] == "3"
    assert worker.env["RANK"] == worker.env["NODE_RANK"] == worker.env["PET_NODE_RANK"] == str(rank)
    assert worker.env["KUBETRAIN_JOB_NAME"] == "demo"
    assert worker.env["KUBETRAIN_POD_NAME"].startswith("demo")
    assert worker.argv[-2:] == ["kubetrain", "train"]


def test_mount_paths_become_local_directories_in_the_trainer_config(tmp_path: Path) -> None:
    job = _job(TRAINER_SPEC)
    directories = processes.mount_directories(job.spec, {"data": tmp_path / "mine"}, tmp_path / "work")
    config = json.loads(
        processes.plan_local_workers(job, directories, master_port=1)[0].env["KUBETRAIN_TRAINER_CONFIG"]
    )
    assert config["data"]["root"] == str((tmp_path / "mine" / "set").resolve())
    assert config["output_dir"] == str((tmp_path / "work" / "output").resolve())


def test_custom_command_args_are_expanded_and_rewritten(tmp_path: Path) -> None:
    job = _job(
        {
            "workers": 2,
            "command": ["python", "/output/train.py"],
            "args": ["--rank", "$(RANK)", "--out=/output/x", "$(UNDEFINED)"],
            "launcher": "plain",
            "storage": [{"name": "output", "mountPath": "/output", "emptyDir": {}}],
        }
    )
    directories = processes.mount_directories(job.spec, {}, tmp_path)
    worker = processes.plan_local_workers(job, directories, master_port=1)[1]
    out = str((tmp_path / "output").resolve())
    assert worker.argv == ["python", f"{out}/train.py", "--rank", "1", "--out=/output/x", "$(UNDEFINED)"]


def test_secret_env_is_refused_naming_the_variable(tmp_path: Path) -> None:
    spec = {
        **TRAINER_SPEC,
        "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
    }
    job = _job(spec)
    with pytest.raises(processes.LocalRunError, match="TOKEN: secretKeyRef"):
        processes.plan_local_workers(job, processes.mount_directories(job.spec, {}, tmp_path), master_port=1)


def test_mount_for_an_unknown_volume_is_refused(tmp_path: Path) -> None:
    with pytest.raises(processes.LocalRunError, match="nope"):
        processes.mount_directories(_job(TRAINER_SPEC).spec, {"nope": tmp_path}, tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: Pod\n", "kind is 'Pod', expected TrainingJob"),
        (
            "- apiVersion: kubetrain.io/v1alpha1\n  kind: TrainingJob\n",
            "the document is a list, not a mapping",
        ),
        ("just words\n", r"a single value \(str\), not a mapping: a TrainingJob starts with `apiVersion:`"),
        ("", "is empty"),
        (
            "kind: TrainingJob\napiVersion: kubetrain.io/v1alpha1\nspec: {workers: 0, trainer: {}}\n",
            "spec.workers",
        ),
        ("{ not yaml", "not valid YAML"),
    ],
)
def test_bad_manifest_is_refused_naming_file_and_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "tj.yaml"
    path.write_text(content)
    with pytest.raises(processes.LocalRunError, match=message) as refused:
        processes.load_trainingjob(path)
    assert str(path) in str(refused.value)


def test_a_missing_data_root_is_extracted_from_the_archive_beside_the_manifest(tmp_path: Path) -> None:
    """`kubetrain run -f examples/cifar10-cpu.yaml --local` from a fresh clone: the sample is committed
    as examples/data/cifar10-sample.tar.gz and unpacked where the data volume's local directory is."""
    manifest = tmp_path / "examples" / "job.yaml"
    (manifest.parent / "data").mkdir(parents=True)
    sample = tmp_path / "sample" / "set" / "train" / "cat"
    sample.mkdir(parents=True)
    (sample / "0.jpg").write_bytes(b"jpeg")
    with tarfile.open(manifest.parent / "data" / "set.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / "sample" / "set", arcname="set")
    job = _job({**TRAINER_SPEC, "trainer": {**TRAINER_SPEC["trainer"], "data": {"root": "/data/set"}}})
    directories = processes.mount_directories(job.spec, {}, tmp_path / "runs")
    said = processes.provide_sample(job, directories, manifest)
    assert said is not None and "set.tar.gz" in said
    assert (tmp_path / "runs" / "data" / "set" / "train" / "cat" / "0.jpg").read_bytes() == b"jpeg"
    assert processes.provide_sample(job, directories, manifest) is None, "extracted once, then used"
