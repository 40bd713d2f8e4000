"""The trainer on a GPU: what CI (no GPU) cannot show, run where a GPU is lent (`benchmarks/trainer_gpu.py`
runs this file first on such a machine).

On a GPU the trainer differs from its CPU path in ways that break only there: the batches are cropped and
flipped on the device with device-side generators, the forward pass runs under bf16 autocast, the
whitening filters are fitted on the CPU and moved, the checkpoint holds CUDA tensors and generator states,
and `model.pt` must still load for CPU inference. bf16 and cuDNN's algorithm choice make a resumed run
differ from an uninterrupted one in the last bits, so resumption is checked against a tolerance measured
beside the difference a different seed makes.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import PREDICT_DIR, kubetrain, trainer_env

pytestmark = [
    pytest.mark.trains,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

EPOCHS = 3


def _config(root: Path, output: Path, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model": "whitened_cnn",
        "width": 32,
        "epochs": EPOCHS,
        "batch_size": 128,
        "seed": 5,
        "device": "cuda",
        "augment": True,
        "crop_padding": 2,
        "flip": "alternating",
        "eval_flip_tta": True,
        "eval_translate_tta": True,
        "output_dir": str(output),
        "checkpoint_every_steps": 7,
        "checkpoint_every_seconds": 0,
        "keep_checkpoints": 100,
        "data": {"dataset": "imagefolder", "root": str(root), "validation_fraction": 0.1},
        "optimizer": {
            "lr": 0.2,
            "momentum": 0.9,
            "nesterov": True,
            "weight_decay": 5e-4,
            "schedule": "onecycle",
            "warmup_epochs": 0.3,
            "label_smoothing": 0.2,
            "lookahead": True,
        },
    }
    config.update(overrides)
    return config


def _train(config: dict[str, Any], job: str, attempt: int = 0) -> str:
    env = trainer_env(config, KUBETRAIN_JOB_NAME=job, KUBETRAIN_RESTART_ATTEMPT=str(attempt))
    result = kubetrain("train", env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stderr


def _flat_weights(job_dir: Path) -> torch.Tensor:
    state = torch.load(job_dir / "model.pt", weights_only=True, map_location="cpu")["state_dict"]
    return torch.cat([v.float().flatten() for k, v in sorted(state.items()) if v.is_floating_point()])


@pytest.fixture(scope="module")
def gpu_run(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted GPU run on the 3,000-image sample: its job directory."""
    output = tmp_path_factory.mktemp("gpu")
    log = _train(_config(sample_root, output), "whole")
    assert "device cuda:0" in log
    return output / "whole"


def test_a_gpu_run_learns_and_records_its_device(gpu_run: Path) -> None:
    job_dir = gpu_run
    metrics = json.loads((job_dir / "metrics.json").read_text())
    accuracies = [epoch["val_accuracy"] for epoch in metrics["epochs"]]
    assert len(accuracies) == EPOCHS
    assert accuracies[-1] > 0.3  # chance is 0.1; the CPU recipe reaches about 0.4 on this sample
    assert metrics["provenance"]["config"]["device"] == "cuda"


def test_a_compiled_gpu_run_learns(sample_root: Path, tmp_path: Path) -> None:
    """torch.compile under bf16 autocast once trained to chance: amax's backward made every gradient NaN."""
    _train(_config(sample_root, tmp_path, compile=True, epochs=2), "compiled")
    epochs = json.loads((tmp_path / "compiled" / "metrics.json").read_text())["epochs"]
    assert all(math.isfinite(epoch["train_loss"]) for epoch in epochs)
    assert epochs[-1]["val_accuracy"] > 0.3


def test_a_model_trained_on_the_gpu_predicts_on_a_cpu(gpu_run: Path) -> None:
    job_dir = gpu_run
    result = kubetrain("predict", str(job_dir / "model.pt"), str(PREDICT_DIR), "--json", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    predictions = json.loads(result.stdout)
    correct = sum(Path(p["path"]).parent.name == p["label"] for p in predictions)
    assert correct / len(predictions) > 0.25


def test_a_gpu_run_resumed_mid_epoch_ends_near_the_uninterrupted_weights(
    gpu_run: Path, sample_root: Path, tmp_path: Path
) -> None:
    whole = gpu_run
    checkpoint = sorted((whole / "checkpoints").glob("attempt-0000-epoch-000002-step-*.pt"))[0]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    for path in (checkpoint, checkpoint.with_name(checkpoint.name + ".sha256")):
        shutil.copy2(path, resumed / "checkpoints" / path.name)

    log = _train(_config(sample_root, tmp_path), "resumed", attempt=1)
    assert "resumed from checkpoint" in log and "in restart attempt 1: epoch 2" in log

    other_seed = tmp_path / "other"
    _train(_config(sample_root, other_seed, seed=6), "other")
    reference = _flat_weights(whole)
    resume_gap = (_flat_weights(resumed) - reference).norm() / reference.norm()
    seed_gap = (_flat_weights(other_seed / "other") - reference).norm() / reference.norm()
    print(f"relative weight difference: resumed {resume_gap:.5f}, another seed {seed_gap:.5f}")
    assert resume_gap < 0.1 * seed_gap


def test_batches_streamed_to_a_gpu_through_pinned_memory_are_those_of_the_device_copy(
    sample_root: Path, tmp_path: Path
) -> None:
    """A set too big for the GPU is streamed: gathered and padded on the host, pinned, copied per step with
    one prefetched, and cropped and flipped on the device by the same generators as the device copy."""
    from kubetrain_trainer import batches, datasets
    from kubetrain_trainer.preprocessing import Preprocessing

    split = datasets.load_image_folder_split(
        sample_root, 32, validation_fraction=0.1, cache="disk", cache_dir=str(tmp_path / "cache")
    )
    loaders = [
        batches.BatchLoader(
            split.train,
            Preprocessing(32, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
            batch_size=128,
            rank=0,
            world_size=1,
            seed=3,
            augment=True,
            device=torch.device("cuda"),
            resident=resident,
        )
        for resident in (True, False)
    ]
    for loader in loaders:
        loader.set_epoch(2, start_step=4)
    for (on_device, device_labels), (streamed, labels) in zip(*loaders, strict=True):
        assert streamed.is_cuda and torch.equal(streamed, on_device) and torch.equal(labels, device_labels)
