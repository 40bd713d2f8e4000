"""`kubetrain evaluate` and `predict` score a model with the test-time views its run validated with
(issue 26 defect 5): metrics.json of a recipe with 6-view test-time augmentation (flips and one-pixel
shifts) is what `kubetrain evaluate model.pt` prints and what `predict` answers image by image; `--tta`
chooses other views.

Before the fix both commands used no views unless `--tta` was given, and then flips only (2 views), so the
deployed model scored under the recorded figure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from kubetrain_trainer import artifacts, datasets, evaluation
from trainer_helpers import kubetrain, trainer_env

pytestmark = pytest.mark.trains


def _recipe(root: Path, output: Path) -> dict[str, Any]:
    """The fast recipe's evaluation (flip and translate views) on a tiny whitened_cnn and 400 real images."""
    return {
        "model": "whitened_cnn",
        "width": 8,
        "epochs": 2,
        "batch_size": 32,
        "seed": 4,
        "augment": True,
        "crop_padding": 2,
        "flip": "alternating",
        "eval_flip_tta": True,
        "eval_translate_tta": True,
        "cpu_threads": 1,
        "output_dir": str(output),
        "checkpoint_every_seconds": 0,
        "data": {"dataset": "imagefolder", "root": str(root), "validation_fraction": 0.25},
        "optimizer": {"lr": 0.2, "nesterov": True, "schedule": "onecycle", "label_smoothing": 0.2},
    }


def _matrix(predictions: list[dict[str, Any]], classes: list[str]) -> list[list[int]]:
    """The confusion matrix of `predict --json` answers whose true class is the image's directory."""
    matrix = [[0] * len(classes) for _ in classes]
    for p in predictions:
        matrix[classes.index(Path(p["path"]).parent.name)][p["label_id"]] += 1
    return matrix


def test_evaluate_and_predict_reproduce_metrics_json_of_a_six_view_run(
    small_root: Path, tmp_path: Path
) -> None:
    trained = kubetrain("train", env=trainer_env(_recipe(small_root, tmp_path), KUBETRAIN_JOB_NAME="tta"))
    assert trained.returncode == 0, trained.stderr[-3000:]
    job = tmp_path / "tta"
    metrics = json.loads((job / "metrics.json").read_text())

    evaluated = kubetrain("evaluate", str(job / "model.pt"), "--json", "--device", "cpu")
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads(evaluated.stdout)
    assert report["images"] == sum(map(sum, metrics["confusion_matrix"])) == 100
    assert report["confusion_matrix"] == metrics["confusion_matrix"]  # to the image
    assert report["accuracy"] == metrics["accuracy"]
    assert report["loss"] == pytest.approx(metrics["epochs"][-1]["val_loss"], abs=1e-5)

    # The validation split is the last quarter of every class in file order: predict those files.
    _, samples = datasets.list_image_folder(small_root)
    held_out = _tails(samples)
    validation_files = [str(path) for path, _ in samples if path in held_out]
    predicted = kubetrain("predict", str(job / "model.pt"), *validation_files, "--json", "--device", "cpu")
    assert predicted.returncode == 0, predicted.stderr
    assert _matrix(json.loads(predicted.stdout), metrics["classes"]) == metrics["confusion_matrix"]

    # --tta chooses other views: none at all is the plain forward pass, which this model scores otherwise.
    plain = kubetrain("evaluate", str(job / "model.pt"), "--json", "--device", "cpu", "--tta", "none")
    assert plain.returncode == 0, plain.stderr
    model = artifacts.load_model(job / "model.pt", torch.device("cpu"))
    _, validation = datasets.split_validation(datasets.load_image_folder(small_root, 32, cache=True), 0.25)
    expected = evaluation.evaluate(
        model.model, validation, model.preprocessing, device=torch.device("cpu"), batch_size=512
    )
    assert json.loads(plain.stdout)["confusion_matrix"] == expected.matrix.tolist()
    assert expected.matrix.tolist() != metrics["confusion_matrix"], "the views must matter for this test"


def _tails(samples: list[tuple[Path, int]]) -> set[Path]:
    """The files `datasets.split_validation` holds out at 0.25: the last quarter of each class."""
    by_class: dict[int, list[Path]] = {}
    for path, label in samples:
        by_class.setdefault(label, []).append(path)
    return {path for paths in by_class.values() for path in paths[len(paths) - round(len(paths) * 0.25) :]}
