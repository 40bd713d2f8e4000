"""A run without a validation split (`data.validation_fraction: 0`, issue 26 defect 2): it trains to the end,
writes its artifacts and succeeds, and every validation figure it reports is null, not a measured 0.0.

Before the fix, rank 0 raised an IndexError after model.pt (the prediction grid indexed an empty split);
exit 1 is retryable, so the job crash-looped from its last checkpoint until maxRestarts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_helpers import kubetrain, trainer_env

pytestmark = pytest.mark.trains


def test_a_run_without_validation_succeeds_and_reports_null_validation_figures(tmp_path: Path) -> None:
    config = {
        "model": "simple_cnn",
        "epochs": 2,
        "batch_size": 16,
        "seed": 1,
        "cpu_threads": 1,
        "output_dir": str(tmp_path),
        "checkpoint_every_seconds": 0,
        "data": {"dataset": "fake", "fake_size": 64, "validation_fraction": 0},
    }
    result = kubetrain("train", env=trainer_env(config, KUBETRAIN_JOB_NAME="noval"), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    job = tmp_path / "noval"
    for name in ("model.pt", "metrics.json", "progress.json", "loss_curve.png"):
        assert (job / name).is_file(), name

    progress = json.loads((job / "progress.json").read_text())
    assert (progress["epoch"], progress["epochs"]) == (2, 2)
    assert progress["loss"] is not None
    assert progress["validationLoss"] is None and progress["accuracy"] is None

    metrics = json.loads((job / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    for epoch in metrics["epochs"]:
        assert epoch["train_loss"] is not None
        assert epoch["val_loss"] is None and epoch["val_accuracy"] is None
    assert metrics["accuracy"] is None
    assert metrics["provenance"]["data"]["validation_images"] == 0
