"""Optimiser construction and the learning-rate schedule as a pure function of the step.

The schedule keeps no state of its own: a resumed run recomputes the rate from the restored step count,
so checkpoints only need the optimiser's state and the step.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from kubetrain_trainer.config import OptimizerConfig
from kubetrain_trainer.muon import Muon


def build_optimizer(model: nn.Module, config: OptimizerConfig) -> torch.optim.Optimizer:
    """SGD, AdamW or Muon; batch-norm and bias parameters get no weight decay (decaying them only hurts).

    Muon takes the convolution filters at `filter_lr` (a group whose `lr_scale` is filter_lr / lr, so
    one schedule drives both) and SGD the rest.
    """
    trained = [param for param in model.parameters() if param.requires_grad]
    vectors = [param for param in trained if param.ndim <= 1]
    if config.name == "muon":
        filters = [param for param in trained if param.ndim == 4]
        matrices = [param for param in trained if param.ndim > 1 and param.ndim != 4]
        return Muon(
            [
                {"params": filters, "orthogonal": True, "lr_scale": config.filter_lr / config.lr},
                {"params": matrices, "weight_decay": config.weight_decay},
                {"params": vectors},
            ],
            momentum=config.momentum,
            nesterov=config.nesterov,
        )
    groups = [
        {"params": [param for param in trained if param.ndim > 1], "weight_decay": config.weight_decay},
        {"params": vectors, "weight_decay": 0.0},
    ]
    if config.name == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr)
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov)


class RunLength(NamedTuple):
    """How long a run is in optimizer steps, and over how many (started) epochs they fall."""

    steps_per_epoch: int
    total_steps: int
    epochs: int

    def steps_in(self, epoch: int) -> int:
        """Steps of epoch `epoch` (1-based): all of them but in a fractional run's last, its share.

        Counted within the epoch, not against the run's total, so that a run resized midway (whose earlier
        steps were of another size) still trains every epoch to its end.
        """
        if epoch < self.epochs:
            return self.steps_per_epoch
        return self.total_steps - (self.epochs - 1) * self.steps_per_epoch


def run_length(steps_per_epoch: int, epochs: float) -> RunLength:
    """`epochs` passes of `steps_per_epoch` steps, a fraction rounded to whole steps (at least one).

    The schedule is sized to the total, so 1.5 epochs decays to zero halfway through the second pass;
    the count of epochs is the started ones, which is what progress and the epoch loop count.
    """
    total = max(1, round(steps_per_epoch * epochs))
    return RunLength(steps_per_epoch, total, math.ceil(total / steps_per_epoch))


def lr_factor(config: OptimizerConfig, step: int, total_steps: int, steps_per_epoch: int) -> float:
    """Multiplier of the peak rate at `step`: linear warmup, then constant, one-cycle or cosine decay.

    One-cycle here is the triangular variant of the speed-run literature: a linear ramp up over the
    warmup, then a linear ramp down to zero at the last step.
    """
    warmup = min(total_steps, round(config.warmup_epochs * steps_per_epoch))
    if step < warmup:
        return (step + 1) / warmup
    if config.schedule == "constant":
        return 1.0
    remaining = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / remaining)
    if config.schedule == "onecycle":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, peak_lr: float, factor: float) -> float:
    """Apply the scheduled rate to every parameter group (times its `lr_scale`, where Muon sets one) and
    return it (for logging)."""
    lr = peak_lr * factor
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    return lr
