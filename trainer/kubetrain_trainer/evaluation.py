"""Forward passes without gradients: validation during training, `kubetrain evaluate`, and predict."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional

from kubetrain_trainer import batches
from kubetrain_trainer.datasets import LabeledImages
from kubetrain_trainer.preprocessing import Preprocessing


def autocast_for(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on GPUs (tensor cores, no loss scaling needed); full precision on CPU.

    On CPU, bf16 autocast is slower than fp32 on most cores without AMX, so it stays off.
    """
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def log_probabilities(model: nn.Module, images: torch.Tensor, flip_tta: bool) -> torch.Tensor:
    """Log-softmax over classes, averaged in probability space with the mirrored image when `flip_tta`."""
    with autocast_for(images.device):
        logits = model(images).float()
        if not flip_tta:
            return functional.log_softmax(logits, dim=1)
        mirrored = model(images.flip(3)).float()
    probs = 0.5 * (functional.softmax(logits, dim=1) + functional.softmax(mirrored, dim=1))
    return probs.clamp_min(1e-12).log()


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
) -> EvalResult:
    """Loss, confusion matrix and top-1 predictions of `model` on `data` (in eval mode, restored after)."""
    was_training = model.training
    model.eval()
    num_classes = len(data.classes)
    matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    loss_sum, count = 0.0, 0
    predictions, scores = [], []
    for images, labels in batches.eval_batches(data, preprocessing, batch_size, device):
        log_probs = log_probabilities(model, images, flip_tta)
        loss_sum += float(functional.nll_loss(log_probs, labels, reduction="sum"))
        count += len(labels)
        top_score, top = log_probs.exp().max(dim=1)
        predictions.append(top.cpu())
        scores.append(top_score.cpu())
        flat = labels.cpu() * num_classes + top.cpu()
        matrix += torch.bincount(flat, minlength=num_classes * num_classes).view(num_classes, num_classes)
    model.train(was_training)
    empty = torch.zeros(0)
    return EvalResult(
        loss_sum,
        count,
        matrix,
        torch.cat(predictions) if predictions else empty.long(),
        torch.cat(scores) if scores else empty,
    )
