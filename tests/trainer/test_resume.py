"""A checkpoint resumes only the TrainingJob (uid) that wrote it, with a compatible config.

A job re-created under the same name (a new uid), or a local run whose model changed, starts fresh and
says why; the same job restarted resumes where its checkpoint left off.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from kubetrain_trainer import checkpoints, config
from kubetrain_trainer.config import TrainerConfig
from trainer_helpers import kubetrain, trainer_env


def _config(output: Path, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "model": "simple_cnn",
        "epochs": 1,
        "batch_size": 16,
        "cpu_threads": 1,
        "output_dir": str(output),
        "data": {"dataset": "fake", "fake_size": 64, "validation_fraction": 0.25},
    }
    values.update(overrides)
    return values


def _epochs(job_dir: Path) -> list[int]:
    return [e["epoch"] for e in json.loads((job_dir / "metrics.json").read_text())["epochs"]]


@pytest.mark.trains
def test_a_new_job_under_the_same_name_starts_fresh_and_the_same_job_resumes(tmp_path: Path) -> None:
    first = trainer_env(_config(tmp_path), KUBETRAIN_JOB_NAME="same", KUBETRAIN_JOB_UID="uid-a")
    assert kubetrain("train", env=first).returncode == 0

    restarted = kubetrain("train", "--epochs", "2", env=first)
    assert restarted.returncode == 0, restarted.stderr
    # Its own checkpoint, from the end of epoch 1:
    assert re.search(
        r"epoch-000001-step-\d+\.pt in restart attempt 0: epoch 1 of 2, step (\d+) \(\1 of \1 ",
        restarted.stderr,
    )
    assert _epochs(tmp_path / "same") == [1, 2]

    recreated = trainer_env(_config(tmp_path, epochs=2), KUBETRAIN_JOB_NAME="same", KUBETRAIN_JOB_UID="uid-b")
    result = kubetrain("train", env=recreated)
    assert result.returncode == 0, result.stderr
    assert "resumed from checkpoint" not in result.stderr
    assert "written by TrainingJob uid uid-a, this is uid uid-b" in result.stderr
    assert _epochs(tmp_path / "same") == [1, 2]  # both epochs trained again, by the new job


@pytest.mark.trains
def test_a_changed_model_under_the_same_name_starts_fresh_instead_of_crashing(tmp_path: Path) -> None:
    env = trainer_env(_config(tmp_path, epochs=2), KUBETRAIN_JOB_NAME="local")
    assert kubetrain("train", env=env).returncode == 0

    changed = trainer_env(_config(tmp_path, model="resnet_small", width=8), KUBETRAIN_JOB_NAME="local")
    result = kubetrain("train", env=changed)
    assert result.returncode == 0, result.stderr
    assert "model simple_cnn -> resnet_small" in result.stderr
    checkpoint_dir = tmp_path / "local" / "checkpoints"
    # The old run's are gone: only the new run's single epoch is left.
    (left,) = checkpoint_dir.glob("*.pt")
    assert left.name.startswith("attempt-0000-epoch-000001-step-")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("changes", "checkpoint_epoch", "why"),
    [
        ({}, 3, None),
        ({"checkpoint_every_seconds": 60, "checkpoint_every_steps": 100}, 3, None),
        ({"epochs": 20, "output_dir": "/elsewhere", "cpu_threads": 2, "device": "cpu"}, 3, None),
        ({"data": {"dataset": "fake", "root": "/mnt/data"}}, 3, None),
        ({"epochs": 2}, 3, "checkpoint epoch 3 is past this run's epochs 2"),
        ({"seed": 7}, 3, "seed 0 -> 7"),
        ({"optimizer": {"name": "adamw"}}, 3, "optimizer.name sgd -> adamw"),
        (
            {"data": {"dataset": "fake", "image_size": 64}, "model": "resnet_small"},
            3,
            "data.image_size 32 -> 64",
        ),
    ],
)
def test_which_config_changes_a_resume_tolerates(
    changes: dict[str, Any], checkpoint_epoch: int, why: str | None
) -> None:
    saved = TrainerConfig.model_validate({"epochs": 10, "data": {"dataset": "fake"}})
    current = TrainerConfig.model_validate({"epochs": 10, "data": {"dataset": "fake"}, **changes})
    identity = config.resume_identity(saved)
    reason = checkpoints.resume_mismatch(
        {"job_uid": "u", "classes": ["a"], "config": identity, "world_size": 2, "epoch": checkpoint_epoch},
        {"job_uid": "u", "classes": ["a"], "config": config.resume_identity(current), "world_size": 2},
        current.epochs,
    )
    assert (reason is None) if why is None else (why in (reason or "")), reason


@pytest.mark.unit
@pytest.mark.parametrize(
    ("saved", "now", "continues_at"),
    [
        ({"world_size": 2, "global_batch": 128}, {"world_size": 2, "global_batch": 128}, 5),
        ({"world_size": 2, "global_batch": 128}, {"world_size": 4, "global_batch": 128}, 5),  # elastic
        ({"world_size": 3, "global_batch": 255}, {"world_size": 2, "global_batch": 256}, 5),  # rounding
        ({"world_size": 2, "global_batch": 128}, {"world_size": 4, "global_batch": 256}, 2),  # 640 of 1024
        ({"world_size": 2}, {"world_size": 4, "global_batch": 256}, 2),  # older: same per-rank batch
        ({"world_size": 4, "global_batch": 64}, {"world_size": 1, "global_batch": 512}, 1),  # never 0
    ],
)
def test_a_mid_epoch_position_carries_over_to_another_group_size_by_images_seen(
    saved: dict[str, int], now: dict[str, int], continues_at: int
) -> None:
    identity = config.resume_identity(TrainerConfig.model_validate({"data": {"dataset": "fake"}}))
    base = {"job_uid": "u", "classes": ["a"], "config": identity}
    assert checkpoints.resume_mismatch({**base, **saved, "epoch": 3}, {**base, **now}, epochs=10) is None
    assert checkpoints.equivalent_epoch_step({**base, **saved}, {**base, **now}, 5) == continues_at
