"""The final model file and metrics.json: what a finished TrainingJob leaves in `<output>/<job>/`.

model.pt holds only tensors and plain types (weights, config JSON, class names, preprocessing), so it
loads with `torch.load(weights_only=True)` and needs no pickled code from the trainer that wrote it.
Both files carry the run's `provenance.record` (config, code version, data origin) under `provenance`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kubetrain_trainer import atomic, models
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.failures import ConfigError
from kubetrain_trainer.preprocessing import Preprocessing

MODEL_FILE = "model.pt"
METRICS_FILE = "metrics.json"
MODEL_FORMAT = "kubetrain-model/1"


@dataclass
class TrainedModel:
    """A network ready for inference with the class names and preprocessing it was trained with."""

    model: nn.Module
    config: TrainerConfig
    classes: list[str]
    preprocessing: Preprocessing


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP and torch.compile wrappers, whose state_dict keys have no prefixes."""
    inner = getattr(model, "module", model)
    return getattr(inner, "_orig_mod", inner)


def save_model(
    path: Path,
    model: nn.Module,
    config: TrainerConfig,
    classes: list[str],
    prep: Preprocessing,
    *,
    provenance: dict[str, Any],
) -> None:
    """Write model.pt atomically; weights are stored contiguous on the CPU so any device can load them."""
    state = {k: v.detach().cpu().contiguous() for k, v in unwrap(model).state_dict().items()}
    blob = {
        "format": MODEL_FORMAT,
        "config": config.model_dump_json(),
        "classes": list(classes),
        "preprocessing": prep.to_dict(),
        "provenance": provenance,
        "state_dict": state,
    }
    atomic.write_atomic(path, lambda tmp: torch.save(blob, tmp))


def load_model(path: Path, device: torch.device) -> TrainedModel:
    """Load a model file written by `save_model`; a missing or foreign file is a ConfigError naming it."""
    if not path.is_file():
        raise ConfigError(f"model file {path} does not exist")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ConfigError(f"model file {path} is not a readable kubetrain model: {error}") from error
    if not isinstance(blob, dict) or blob.get("format") != MODEL_FORMAT:
        raise ConfigError(f"model file {path} is not a kubetrain model (format {MODEL_FORMAT} expected)")
    config = TrainerConfig.model_validate_json(blob["config"])
    classes = list(blob["classes"])
    model = models.build(config.model, len(classes), config.width)
    model.load_state_dict(blob["state_dict"])
    model.to(device).to(memory_format=torch.channels_last).eval()
    return TrainedModel(model, config, classes, Preprocessing.from_dict(blob["preprocessing"]))


def write_metrics(
    path: Path, history: list[dict[str, Any]], report: dict[str, Any], provenance: dict[str, Any]
) -> None:
    """metrics.json: per-epoch history, the final per-class report and confusion matrix, provenance."""
    blob = {"epochs": history, **report, "provenance": provenance}
    atomic.write_text_atomic(path, json.dumps(blob, indent=2) + "\n")
