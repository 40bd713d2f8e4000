"""The speed recipe's own state survives a restart: a run of whitened_cnn with lookahead and alternating
flips, resumed from a mid-epoch checkpoint, ends with bit-identical weights to one never interrupted.

What only this recipe adds to a resume: the whitening filters fitted at start-up (restored from the
checkpoint, not refitted), the lookahead average (checkpointed; its decay recomputed from the step), the
alternating flips (a pure function of seed, epoch and image) and muon's filter groups, whose momentum and
learning-rate scale must come back with the right parameters. One process, one thread, CPU.
"""

from __future__ import annotations

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
        "epochs": 2,
        "batch_size": 8,
        "seed": 5,
        "augment": True,
        "crop_padding": 2,
        "flip": "alternating",
        "eval_flip_tta": True,
        "eval_translate_tta": True,
        "cpu_threads": 1,
        "output_dir": str(output),
        "checkpoint_every_steps": 3,
        "checkpoint_every_seconds": 0,
        "keep_checkpoints": 10,
        "data": {"dataset": "fake", "fake_size": 96, "validation_fraction": 0.25},
        "optimizer": {
            "name": "muon",
            "lr": 0.2,
            "nesterov": True,
            "schedule": "onecycle",
            "warmup_epochs": 0.5,
            "label_smoothing": 0.2,
            "lookahead": True,
        },
    }


def _train(output: Path, job: str) -> str:
    result = kubetrain("train", env=trainer_env(_config(output), KUBETRAIN_JOB_NAME=job))
    assert result.returncode == 0, result.stderr
    return result.stderr


def _weights(job_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(job_dir / "model.pt", weights_only=True)["state_dict"]


def test_a_resumed_fast_recipe_run_ends_with_the_weights_of_one_never_interrupted(tmp_path: Path) -> None:
    _train(tmp_path, "whole")
    whole = tmp_path / "whole"
    # Step 12 of 16: in epoch 2 (the flips are the other way round), after the lookahead update at step
    # 10 and before the one at 15 that needs the checkpointed average.
    (checkpoint,) = (whole / "checkpoints").glob("attempt-0000-epoch-*-step-0000000012.pt")
    resumed = tmp_path / "resumed" / "checkpoints"
    resumed.mkdir(parents=True)
    for path in (checkpoint, checkpoint.with_name(checkpoint.name + ".sha256")):
        shutil.copy2(path, resumed / path.name)

    assert "resumed from checkpoint" in _train(tmp_path, "resumed")
    ours, theirs = _weights(tmp_path / "resumed"), _weights(whole)
    assert ours.keys() == theirs.keys() and "whiten.conv.weight" in ours
    for name in theirs:
        assert torch.equal(ours[name], theirs[name]), name
