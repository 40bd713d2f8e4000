"""Forward passes without gradients: validation during training, `kubetrain evaluate`, and predict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional

from kubetrain_trainer import batches, precision
from kubetrain_trainer.artifacts import TrainedModel
from kubetrain_trainer.config import TEST_TIME_VIEWS, TrainerConfig
from kubetrain_trainer.datasets import LabeledImages
from kubetrain_trainer.preprocessing import Preprocessing


def chosen_views(choice: str, config: TrainerConfig) -> tuple[bool, bool]:
    """(flip_tta, translate_tta) for a `config.TEST_TIME_VIEWS` entry; `run` reads the model's own config,
    so that `kubetrain evaluate model.pt` reproduces metrics.json and `predict` the model the run
    reported."""
    if choice == "run":
        return config.eval_flip_tta, config.eval_translate_tta
    if choice not in TEST_TIME_VIEWS:
        raise ValueError(f"test-time views {choice!r} is not one of {', '.join(TEST_TIME_VIEWS)}")
    return "flip" in choice, "translate" in choice


def test_time_views(
    images: torch.Tensor, flip_tta: bool, translate_tta: bool
) -> list[tuple[float, torch.Tensor]]:
    """(weight, batch) pairs whose weighted predictions make the test-time-augmented prediction.

    Translation adds the batch shifted one pixel up-left and one pixel down-right (reflect padding), at
    half the weight of the unshifted batch in total; flipping adds each view's mirror image at equal weight.
    """
    views = [(1.0, images)]
    if translate_tta:
        size_h, size_w = images.shape[-2:]
        padded = functional.pad(images, (1, 1, 1, 1), mode="reflect")
        views = [(0.5, images), (0.25, padded[..., :size_h, :size_w]), (0.25, padded[..., 2:, 2:])]
    if flip_tta:
        views = [(weight / 2, view) for weight, batch in views for view in (batch, batch.flip(3))]
    return views


def log_probabilities(
    model: nn.Module,
    images: torch.Tensor,
    flip_tta: bool,
    translate_tta: bool = False,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Log-softmax over classes, averaged in probability space over the `test_time_views` when asked;
    the forward passes run in `dtype` (see `precision`), the averaging in fp32."""
    views = test_time_views(images, flip_tta, translate_tta)
    with precision.autocast(images.device, dtype):
        if len(views) == 1:
            return functional.log_softmax(model(images).float(), dim=1)
        probs = sum(weight * functional.softmax(model(view).float(), dim=1) for weight, view in views)
    return probs.clamp_min(1e-12).log()  # type: ignore[union-attr]


@dataclass
class EvalResult:
    """Summed loss and counts so shards from several ranks can be added before dividing."""

    loss_sum: float
    count: int
    matrix: torch.Tensor
    predictions: torch.Tensor
    scores: torch.Tensor

    @property
    def loss(self) -> float:
        """Mean cross-entropy (0 when nothing was evaluated)."""
        return self.loss_sum / self.count if self.count else 0.0


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: LabeledImages,
    preprocessing: Preprocessing,
    *,
    device: torch.device,
    batch_size: int,
    flip_tta: bool = False,
    translate_tta: bool = False,
    dtype: torch.dtype = torch.float32,
    on_batch: Callable[[], object] | None = None,
) -> EvalResult:
    """Loss, confusion matrix and top-1 predictions of `model` on `data` (in eval mode, restored after);
    `on_batch` is called after every batch."""
    was_training = model.training
    model.eval()
    num_classes = len(data.classes)
    matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    loss_sum, count = 0.0, 0
    predictions, scores = [], []
    for images, labels in batches.eval_batches(data, preprocessing, batch_size, device):
        log_probs = log_probabilities(model, images, flip_tta, translate_tta, dtype=dtype)
        loss_sum += float(functional.nll_loss(log_probs, labels, reduction="sum"))
        count += len(labels)
        top_score, top = log_probs.exp().max(dim=1)
        predictions.append(top.cpu())
        scores.append(top_score.cpu())
        flat = labels.cpu() * num_classes + top.cpu()
        matrix += torch.bincount(flat, minlength=num_classes * num_classes).view(num_classes, num_classes)
        if on_batch is not None:
            on_batch()
    model.train(was_training)
    empty = torch.zeros(0)
    return EvalResult(
        loss_sum,
        count,
        matrix,
        torch.cat(predictions) if predictions else empty.long(),
        torch.cat(scores) if scores else empty,
    )


def evaluate_saved(
    trained: TrainedModel, data: LabeledImages, views: str, *, device: torch.device, batch_size: int
) -> EvalResult:
    """A saved model scored as `kubetrain evaluate` scores it: with the test-time `views` chosen
    (`chosen_views`; "run" for those its run validated with) and in the precision it was trained in."""
    flip_tta, translate_tta = chosen_views(views, trained.config)
    return evaluate(
        trained.model,
        data,
        trained.preprocessing,
        device=device,
        batch_size=batch_size,
        flip_tta=flip_tta,
        translate_tta=translate_tta,
        dtype=precision.compute_dtype(trained.config.precision, device),
    )
