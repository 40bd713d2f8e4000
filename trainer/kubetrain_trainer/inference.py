"""Batched prediction on image files with the preprocessing stored in the model file."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from kubetrain_trainer import evaluation, precision, preprocessing
from kubetrain_trainer.artifacts import TrainedModel
from kubetrain_trainer.datasets import IMAGE_EXTENSIONS
from kubetrain_trainer.failures import DataError


@dataclass(frozen=True)
class Prediction:
    """Top-1 class of one image and its softmax probability."""

    path: str
    label_id: int
    label: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def expand_image_paths(inputs: list[Path]) -> list[Path]:
    """Files as given, directories replaced by their image files (recursively, sorted)."""
    paths: list[Path] = []
    for item in inputs:
        if item.is_dir():
            paths.extend(
                sorted(p for p in item.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
            )
        elif item.is_file():
            paths.append(item)
        else:
            raise DataError(f"image path {item} does not exist")
    if not paths:
        raise DataError(f"no image files found in {', '.join(str(p) for p in inputs)}")
    return paths


def load_images(paths: list[Path], image_size: int) -> torch.Tensor:
    """Decode files to a uint8 NCHW batch exactly as training decoded its dataset."""
    decoded = []
    for path in paths:
        try:
            decoded.append(preprocessing.decode_file(path, image_size))
        except Exception as error:
            raise DataError(f"cannot decode image {path}: {error}") from error
    return torch.stack(decoded)


@torch.no_grad()
def predict_files(
    trained: TrainedModel,
    paths: list[Path],
    device: torch.device,
    batch_size: int,
    *,
    flip_tta: bool = False,
    translate_tta: bool = False,
) -> list[Prediction]:
    """Top-1 prediction per file, `batch_size` images per forward pass, averaged over the test-time views
    asked for (`evaluation.test_time_views`)."""
    prep = trained.preprocessing
    results: list[Prediction] = []
    dtype = precision.compute_dtype(trained.config.precision, device)
    for start in range(0, len(paths), batch_size):
        chunk = paths[start : start + batch_size]
        images = prep.normalize(load_images(chunk, prep.image_size).to(device))
        images = images.contiguous(memory_format=torch.channels_last)
        log_probs = evaluation.log_probabilities(trained.model, images, flip_tta, translate_tta, dtype=dtype)
        scores, labels = log_probs.exp().max(dim=1)
        for path, label, score in zip(chunk, labels.tolist(), scores.tolist(), strict=True):
            results.append(Prediction(str(path), label, trained.classes[label], round(score, 6)))
    return results
