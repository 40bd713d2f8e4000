"""`precision`: which type the forward pass runs in, and a bf16 run on CPU that learns and predicts.

bf16 is the fast recipe's setting on CPUs with AMX or AVX512-BF16; where a CPU has no bf16 units it is
emulated, slower but the same arithmetic, so these tests hold on any CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from kubetrain_trainer import evaluation, precision
from torch import nn
from trainer_helpers import PREDICT_DIR, kubetrain, trainer_env

AMPERE = (8, 0)
"""An A100's compute capability: the first with bf16 tensor cores (H100 is 9.0)."""


@pytest.mark.unit
@pytest.mark.parametrize(
    ("setting", "device", "expected"),
    [
        ("auto", "cpu", torch.float32),
        ("auto", "cuda", torch.bfloat16),
        ("bf16", "cpu", torch.bfloat16),
        ("bf16", "cuda", torch.bfloat16),
        ("fp32", "cpu", torch.float32),
        ("fp32", "cuda", torch.float32),
    ],
)
def test_auto_is_bf16_only_on_a_gpu_and_an_explicit_choice_holds_everywhere(
    setting: precision.Precision, device: str, expected: torch.dtype
) -> None:
    assert precision.compute_dtype(setting, torch.device(device), capability=AMPERE) == expected


@pytest.mark.unit
@pytest.mark.parametrize(
    ("gpu", "capability", "expected"),
    [
        ("P100", (6, 0), torch.float32),
        ("V100", (7, 0), torch.float32),
        ("T4", (7, 5), torch.float32),
        ("A100", (8, 0), torch.bfloat16),
        ("A10", (8, 6), torch.bfloat16),
        ("L4", (8, 9), torch.bfloat16),
        ("H100", (9, 0), torch.bfloat16),
        ("B200", (10, 0), torch.bfloat16),
    ],
)
def test_auto_keeps_fp32_on_gpus_that_only_emulate_bf16(
    gpu: str, capability: tuple[int, int], expected: torch.dtype
) -> None:
    assert precision.compute_dtype("auto", torch.device("cuda"), capability=capability) == expected, gpu
    # Asked for explicitly, bf16 is what the config says, emulated or not.
    assert precision.compute_dtype("bf16", torch.device("cuda"), capability=capability) == torch.bfloat16


@pytest.mark.unit
@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "expected"),
    [(True, True, "AMX"), (False, True, "AVX512-BF16"), (True, False, "AMX"), (False, False, None)],
)
def test_the_cpu_bf16_units_named_are_the_best_the_cpu_has(
    monkeypatch: pytest.MonkeyPatch, amx: bool, avx512_bf16: bool, expected: str | None
) -> None:
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert precision.cpu_bf16_units() == expected


@pytest.mark.unit
def test_bf16_convolutions_run_in_bf16_and_fp32_ones_in_fp32() -> None:
    conv = nn.Conv2d(3, 4, 3)
    images = torch.randn(2, 3, 8, 8)
    cpu = torch.device("cpu")
    with precision.autocast(cpu, torch.bfloat16):
        assert conv(images).dtype == torch.bfloat16
    with precision.autocast(cpu, torch.float32):
        assert conv(images).dtype == torch.float32


@pytest.mark.unit
def test_bf16_predictions_are_fp32_probabilities_close_to_the_fp32_ones() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5))
    images = torch.randn(16, 3, 8, 8)
    full = evaluation.log_probabilities(model, images, True, True).exp()
    half = evaluation.log_probabilities(model, images, True, True, dtype=torch.bfloat16).exp()
    assert half.dtype == torch.float32
    assert torch.allclose(half.sum(dim=1), torch.ones(16))
    assert (half - full).abs().max() < 0.02  # bf16 keeps 8 bits of mantissa: about 2 decimal digits


@pytest.mark.trains
def test_a_bf16_cpu_run_learns_and_its_model_predicts(sample_root: Path, tmp_path: Path) -> None:
    config = {
        "model": "whitened_cnn",
        "width": 16,
        "epochs": 3,
        "batch_size": 64,
        "seed": 2,
        "device": "cpu",
        "precision": "bf16",
        "output_dir": str(tmp_path),
        "checkpoint_every_seconds": 0,
        "data": {"dataset": "imagefolder", "root": str(sample_root), "validation_fraction": 0.1},
        "optimizer": {"lr": 0.2, "nesterov": True, "weight_decay": 5e-4, "schedule": "onecycle"},
    }
    result = kubetrain("train", env=trainer_env(config, KUBETRAIN_JOB_NAME="bf16"), timeout=600)
    assert result.returncode == 0, result.stderr
    assert "device cpu in bfloat16" in result.stderr
    metrics = json.loads((tmp_path / "bf16" / "metrics.json").read_text())
    assert metrics["epochs"][-1]["val_accuracy"] > 0.3  # chance is 0.1
    assert metrics["provenance"]["config"]["precision"] == "bf16"

    predicted = kubetrain("predict", str(tmp_path / "bf16" / "model.pt"), str(PREDICT_DIR), "--json")
    assert predicted.returncode == 0, predicted.stderr
    predictions = json.loads(predicted.stdout)
    correct = sum(Path(p["path"]).parent.name == p["label"] for p in predictions)
    assert correct / len(predictions) > 0.25
