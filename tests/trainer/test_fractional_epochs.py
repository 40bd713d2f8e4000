"""`epochs: 1.5` trains one pass and half of the next, validates and checkpoints at that end, and a run
killed inside the half pass resumes to the same weights (one process, one thread, CPU: `torch.equal`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import kubetrain, trainer_env

pytestmark = pytest.mark.trains


def _config(output: Path) -> dict[str, Any]:
    return {
        "model": "whitened_cnn",
        "width": 8,
        "epochs": 1.5,
        "batch_size": 8,
        "seed": 3,
        "augment": True,
        "flip": "alternating",
        "cpu_threads": 1,
        "output_dir": str(output),
        "checkpoint_every_steps": 5,
        "checkpoint_every_seconds": 0,
        "keep_checkpoints": 10,
        # 96 fake images, a quarter of each class held out: 64 to 71 for training, 8 steps per epoch
        "data": {"dataset": "fake", "fake_size": 96, "validation_fraction": 0.25},
        "optimizer": {"lr": 0.1, "schedule": "onecycle", "warmup_epochs": 0.5, "lookahead": True},
    }


def _train(output: Path, job: str, attempt: int = 0) -> str:
    env = trainer_env(_config(output), KUBETRAIN_JOB_NAME=job, KUBETRAIN_RESTART_ATTEMPT=str(attempt))
    result = kubetrain("train", env=env)
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("fractional")
    _train(output, "whole")
    return output / "whole"


def test_one_and_a_half_epochs_train_twelve_steps_over_two_validated_epochs(whole: Path) -> None:
    metrics = json.loads((whole / "metrics.json").read_text())
    assert [epoch["epoch"] for epoch in metrics["epochs"]] == [1, 2]
    progress = json.loads((whole / "progress.json").read_text())
    assert (progress["epoch"], progress["epochs"], progress["step"]) == (2, 2, 12)
    names = sorted(p.name for p in (whole / "checkpoints").glob("*.pt"))
    assert names == [
        "attempt-0000-epoch-000001-step-0000000005.pt",
        "attempt-0000-epoch-000001-step-0000000008.pt",  # the end of the whole first epoch
        "attempt-0000-epoch-000002-step-0000000010.pt",
        "attempt-0000-epoch-000002-step-0000000012.pt",  # the end of the half epoch, and of the run
    ]


def test_a_run_killed_inside_the_half_epoch_resumes_to_the_uninterrupted_weights(
    whole: Path, tmp_path: Path
) -> None:
    source = whole / "checkpoints" / "attempt-0000-epoch-000002-step-0000000010.pt"
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    for path in (source, source.with_name(source.name + ".sha256")):
        shutil.copy2(path, tmp_path / "resumed" / "checkpoints" / path.name)

    log = _train(tmp_path, "resumed", attempt=1)
    assert "in restart attempt 1: epoch 2 of 2, step 10 (2 of 8 steps of epoch 2 done)" in log
    ours = torch.load(tmp_path / "resumed" / "model.pt", weights_only=True)["state_dict"]
    theirs = torch.load(whole / "model.pt", weights_only=True)["state_dict"]
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)
