"""`kubetrain train | evaluate | predict` end to end on the committed real CIFAR-10 sample."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from kubetrain_trainer import artifacts, datasets, inference
from kubetrain_trainer.exit_codes import ExitCode
from trainer_helpers import PREDICT_DIR, kubetrain, trainer_env


def _config(root: Path, output: Path, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model": "simple_cnn",
        "epochs": 2,
        "batch_size": 64,
        "seed": 0,
        "cpu_threads": 1,
        "output_dir": str(output),
        "data": {"dataset": "imagefolder", "root": str(root), "validation_fraction": 0.1},
        "optimizer": {"lr": 0.02, "momentum": 0.9, "nesterov": True, "schedule": "onecycle"},
    }
    config.update(overrides)
    return config


@pytest.fixture(scope="module")
def trained(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One `kubetrain train` run on the 3,000-image sample (2 epochs of SimpleCNN): its job directory."""
    output = tmp_path_factory.mktemp("output")
    env = trainer_env(_config(sample_root, output), KUBETRAIN_JOB_NAME="sample")
    result = kubetrain("train", env=env)
    assert result.returncode == 0, result.stderr
    assert "macro avg" in result.stderr  # the per-class table is in the log
    return output / "sample"


@pytest.mark.trains
def test_train_writes_every_artifact(trained: Path) -> None:
    for name in ("model.pt", "metrics.json", "progress.json", "loss_curve.png", "confusion_matrix.png"):
        assert (trained / name).is_file(), name
    assert (trained / "predictions.png").read_bytes().startswith(b"\x89PNG")
    metrics = json.loads((trained / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    assert len(metrics["per_class"]) == 10 and {"precision", "recall", "f1"} <= set(metrics["per_class"][0])
    assert sum(map(sum, metrics["confusion_matrix"])) == 300
    progress = json.loads((trained / "progress.json").read_text())
    assert progress["epoch"] == progress["epochs"] == 2
    assert progress["accuracy"] == pytest.approx(metrics["accuracy"])


@pytest.mark.trains
def test_progress_reports_training_and_validation_loss_each_under_its_own_name(trained: Path) -> None:
    progress = json.loads((trained / "progress.json").read_text())
    last = json.loads((trained / "metrics.json").read_text())["epochs"][-1]
    assert progress["loss"] == last["train_loss"]  # status.progress.loss: documented as training loss
    assert progress["validationLoss"] == last["val_loss"]
    assert progress["accuracy"] == last["val_accuracy"]
    assert progress["imagesPerSecond"] == last["images_per_second"] > 0  # the epoch's throughput


@pytest.mark.trains
def test_model_file_loads_with_weights_only_and_carries_its_preprocessing(trained: Path) -> None:
    blob = torch.load(trained / "model.pt", weights_only=True)
    assert blob["classes"][:2] == ["airplane", "automobile"]
    assert blob["preprocessing"]["image_size"] == 32
    assert len(blob["preprocessing"]["mean"]) == 3


@pytest.mark.trains
def test_predict_round_trip_classifies_held_out_images_better_than_chance(trained: Path) -> None:
    result = kubetrain("predict", str(trained / "model.pt"), str(PREDICT_DIR), "--json")
    assert result.returncode == 0, result.stderr
    predictions = json.loads(result.stdout)
    assert len(predictions) == 200
    assert {"path", "label_id", "label", "score"} == set(predictions[0])
    correct = sum(Path(p["path"]).parent.name == p["label"] for p in predictions)
    assert correct / len(predictions) > 0.2  # chance is 0.1; two epochs on 2,700 images reach about 0.3

    one = kubetrain("predict", str(trained / "model.pt"), predictions[0]["path"])
    assert one.stdout.strip() == (
        f"{predictions[0]['path']}: {predictions[0]['label_id']}, {predictions[0]['label']}, "
        f"{predictions[0]['score']:.4f}"
    )


@pytest.mark.trains
def test_predict_preprocesses_a_file_exactly_as_training_did(trained: Path, sample_root: Path) -> None:
    model = artifacts.load_model(trained / "model.pt", torch.device("cpu"))
    data = datasets.load_image_folder(sample_root, 32, cache=True)  # the cache training wrote
    _, samples = datasets.list_image_folder(sample_root)
    index = 1234
    from_training = model.preprocessing.normalize(data.images[index : index + 1])
    from_predict = model.preprocessing.normalize(inference.load_images([samples[index][0]], 32))
    assert torch.equal(from_training, from_predict)
    # and the stored preprocessing is the one fitted on the training split, not a default
    assert model.preprocessing.mean != (0.5, 0.5, 0.5)


@pytest.mark.trains
def test_evaluate_prints_accuracy_and_the_per_class_table(trained: Path) -> None:
    result = kubetrain("evaluate", str(trained / "model.pt"))
    assert result.returncode == 0, result.stderr
    assert "validation split" in result.stdout and "macro avg" in result.stdout
    metrics = json.loads((trained / "metrics.json").read_text())
    assert f"accuracy {metrics['accuracy']:.4f}" in result.stdout


@pytest.mark.unit
def test_invalid_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    env = trainer_env(_config(tmp_path, tmp_path, optimizer={"lr": 0}))
    result = kubetrain("train", env=env)
    assert result.returncode == ExitCode.BAD_CONFIG
    assert "optimizer.lr" in result.stderr


@pytest.mark.unit
def test_missing_data_exits_3_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = kubetrain("train", env=trainer_env(_config(missing, tmp_path)))
    assert result.returncode == ExitCode.DATA_ERROR
    assert str(missing) in result.stderr


@pytest.mark.unit
def test_corrupt_image_exits_3_naming_the_file(small_root: Path, tmp_path: Path) -> None:
    broken = small_root / "cat" / "0007.jpg"
    broken.write_bytes(b"\xff\xd8 this is not a jpeg")
    result = kubetrain("train", env=trainer_env(_config(small_root, tmp_path)))
    assert result.returncode == ExitCode.DATA_ERROR
    assert str(broken) in result.stderr


@pytest.mark.trains
def test_predict_on_a_missing_image_exits_3(trained: Path, tmp_path: Path) -> None:
    result = kubetrain("predict", str(trained / "model.pt"), str(tmp_path / "absent.jpg"))
    assert result.returncode == ExitCode.DATA_ERROR
    assert "absent.jpg" in result.stderr


@pytest.mark.unit
def test_predict_errors_name_the_problem_without_a_rank_prefix(tmp_path: Path) -> None:
    """predict is one process, not a rank of a group: its errors are for the user at the terminal."""
    result = kubetrain("predict", str(tmp_path / "absent.pt"), str(PREDICT_DIR))
    assert result.returncode == ExitCode.BAD_CONFIG
    assert f"model file {tmp_path / 'absent.pt'} does not exist" in result.stderr
    assert "rank" not in result.stderr
