"""A run stopped at any checkpoint and resumed ends with bit-identical weights to one never interrupted.

One process, one thread, CPU: the same operations in the same order, so the comparison is `torch.equal`,
not a tolerance. The recipe exercises everything a resume must restore: shuffled order and random
crop/flip draws (per batch from seed, epoch and step), momentum buffers, the one-cycle learning rate (from
the step count), batch-norm running statistics and the partial epoch's loss totals.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from kubetrain_trainer import provenance
from trainer_helpers import kubetrain, trainer_env

pytestmark = pytest.mark.trains

STEPS_PER_EPOCH = 8  # 96 fake images, a quarter of each class held out: 64 to 71 for training, batch 8
EPOCHS = 2


def _config(output: Path) -> dict[str, Any]:
    return {
        "model": "resnet_small",
        "width": 8,
        "epochs": EPOCHS,
        "batch_size": 8,
        "seed": 11,
        "augment": True,
        "cpu_threads": 1,
        "output_dir": str(output),
        "checkpoint_every_steps": 3,
        "checkpoint_every_seconds": 0,
        "keep_checkpoints": 10,
        "data": {"dataset": "fake", "fake_size": 96, "validation_fraction": 0.25},
        "optimizer": {
            "lr": 0.05,
            "momentum": 0.9,
            "nesterov": True,
            "weight_decay": 5e-4,
            "schedule": "onecycle",
            "warmup_epochs": 0.5,
            "label_smoothing": 0.1,
        },
    }


def _train(output: Path, job: str, attempt: int = 0) -> subprocess.CompletedProcess[str]:
    env = trainer_env(_config(output), KUBETRAIN_JOB_NAME=job, KUBETRAIN_RESTART_ATTEMPT=str(attempt))
    result = kubetrain("train", env=env)
    assert result.returncode == 0, result.stderr
    return result


def _weights(job_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(job_dir / "model.pt", weights_only=True)["state_dict"]


def _history(job_dir: Path) -> list[dict[str, Any]]:
    """Per-epoch figures that do not depend on the machine's speed."""
    epochs = json.loads((job_dir / "metrics.json").read_text())["epochs"]
    return [
        {k: v for k, v in e.items() if k not in {"seconds", "train_seconds", "images_per_second"}}
        for e in epochs
    ]


def _assert_same_result(job_dir: Path, reference: Path) -> None:
    ours, theirs = _weights(job_dir), _weights(reference)
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert torch.equal(ours[name], theirs[name]), name
    assert _history(job_dir) == _history(reference)


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run's job directory; its checkpoints are every state a crash could leave."""
    output = tmp_path_factory.mktemp("whole")
    _train(output, "whole")
    return output / "whole"


def _checkpoint_at(job_dir: Path, step: int) -> Path:
    (path,) = (job_dir / "checkpoints").glob(f"attempt-0000-epoch-*-step-{step:010d}.pt")
    return path


def _crashed_job(whole: Path, job_dir: Path, step: int) -> None:
    """The checkpoint directory a run killed right after writing its step-`step` checkpoint leaves."""
    source = _checkpoint_at(whole, step)
    (job_dir / "checkpoints").mkdir(parents=True)
    for path in (source, source.with_name(source.name + ".sha256")):
        shutil.copy2(path, job_dir / "checkpoints" / path.name)


def test_uninterrupted_run_checkpoints_every_3_steps_and_at_each_epoch_end(whole: Path) -> None:
    names = sorted(p.name for p in (whole / "checkpoints").glob("*.pt"))
    assert names == [
        "attempt-0000-epoch-000001-step-0000000003.pt",
        "attempt-0000-epoch-000001-step-0000000006.pt",
        "attempt-0000-epoch-000001-step-0000000008.pt",  # the end of epoch 1
        "attempt-0000-epoch-000002-step-0000000009.pt",
        "attempt-0000-epoch-000002-step-0000000012.pt",
        "attempt-0000-epoch-000002-step-0000000015.pt",
        "attempt-0000-epoch-000002-step-0000000016.pt",
    ]


@pytest.mark.parametrize(("step", "epoch", "done_in_epoch"), [(8, 1, 8), (12, 2, 4)])
def test_a_run_resumed_from_any_checkpoint_ends_with_the_same_weights_as_one_never_interrupted(
    whole: Path, tmp_path: Path, step: int, epoch: int, done_in_epoch: int
) -> None:
    _crashed_job(whole, tmp_path / "resumed", step)
    result = _train(tmp_path, "resumed", attempt=3)

    assert (
        f"in restart attempt 3: epoch {epoch} of {EPOCHS}, step {step} "
        f"({done_in_epoch} of {STEPS_PER_EPOCH} steps of epoch {epoch} done)"
    ) in result.stderr
    _assert_same_result(tmp_path / "resumed", whole)
    progress = json.loads((tmp_path / "resumed" / "progress.json").read_text())
    assert progress["resumedFrom"] == {"attempt": 3, "epoch": epoch, "step": step}
    assert progress["step"] == EPOCHS * STEPS_PER_EPOCH


def test_model_and_metrics_record_the_config_code_and_data_they_came_from(whole: Path) -> None:
    metrics = json.loads((whole / "metrics.json").read_text())["provenance"]
    model = torch.load(whole / "model.pt", weights_only=True)["provenance"]
    assert model == metrics
    assert metrics["config"]["seed"] == 11 and metrics["config"]["optimizer"]["schedule"] == "onecycle"
    assert metrics["data"]["source"] == "FakeData size=96 image_size=32 random_offset=11"
    assert metrics["data"]["files"] == 96
    assert metrics["data"]["train_images"] + metrics["data"]["validation_images"] == 96
    assert metrics["data"]["train_images"] // 8 == STEPS_PER_EPOCH
    assert len(metrics["data"]["files_sha256"]) == 64
    assert metrics["code"]["source_sha256"] == provenance.source_sha256()
    assert metrics["code"]["torch"] == torch.__version__


def test_a_checkpoint_in_the_older_epoch_only_format_still_resumes_exactly(
    whole: Path, tmp_path: Path
) -> None:
    """What the trainer wrote before mid-epoch checkpoints: `epoch-NNNNNN.pt`, no step counters."""
    blob = torch.load(_checkpoint_at(whole, STEPS_PER_EPOCH), weights_only=True)
    del blob["step"]
    for key in ("epoch_step", "epoch_totals"):
        del blob["state"][key]
    for key in ("epoch_step", "world_size"):
        del blob["extra"][key]
    old = tmp_path / "old" / "checkpoints" / "epoch-000001.pt"
    old.parent.mkdir(parents=True)
    torch.save(blob, old)
    digest = subprocess.run(["sha256sum", str(old)], capture_output=True, text=True, check=True)
    old.with_name(old.name + ".sha256").write_text(digest.stdout.split()[0] + "\n")

    result = _train(tmp_path, "old")
    assert "epoch-000001.pt in restart attempt 0: epoch 1 of 2, step 8" in result.stderr
    _assert_same_result(tmp_path / "old", whole)


def test_a_sigkilled_run_resumes_from_its_last_complete_checkpoint_to_the_same_weights(
    whole: Path, tmp_path: Path
) -> None:
    env = trainer_env(_config(tmp_path), KUBETRAIN_JOB_NAME="killed")
    first_digest = tmp_path / "killed" / "checkpoints" / "attempt-0000-epoch-000001-step-0000000003.pt.sha256"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubetrain_trainer.cli", "train"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not first_digest.exists() and proc.poll() is None:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    # Killed, not finished: training, validation and the figures left after step 3 take far longer
    # than the 5 ms between two looks at the digest.
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed" / "model.pt").exists()

    result = _train(tmp_path, "killed", attempt=1)
    assert "resumed from checkpoint" in result.stderr
    _assert_same_result(tmp_path / "killed", whole)
