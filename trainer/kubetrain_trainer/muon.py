"""Muon for convolution filters: SGD's momentum, orthogonalized, as the later CIFAR-10 speed runs train.

Plain SGD moves a filter bank mostly along the few directions its gradient is largest in. Muon replaces
each bank's (Nesterov) momentum, viewed as an out_channels x (in_channels * k * k) matrix, by the nearest
semi-orthogonal matrix (every singular value 1): the step is equally large in every direction the
gradient spans, so rarely excited filters learn as fast as the dominant ones. On the fast CPU recipe it
bought 2.4 points after 4 epochs for 14 % more time, and nothing beyond noise after 7.4 or 11
(`benchmarks/results/trainer-recipe-ablation-muon-*.md`): a choice for short runs.

Each bank feeds a batch norm, so its scale does not change what the network computes; only its direction
does. The bank is rescaled to a fixed Frobenius norm (sqrt(out_channels), that of an orthogonal update)
before every step, so that a step of rate `lr` turns it by the same angle all run long and the schedule,
not the weights' growth, sets the effective rate. That is why Muon here needs models whose every trainable
convolution feeds batch norm (`config.MODELS_WITH_NORMALIZED_FILTERS`), and why filters get no weight decay.

Every other parameter (biases, batch-norm shifts, the linear head) takes Nesterov SGD with the optimiser
config's momentum and weight decay, in the same optimizer, so checkpoints hold one state dict.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

NEWTON_SCHULZ_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""The quintic iteration's coefficients: chosen so that five steps take every singular value of a matrix
of spectral norm at most 1 into roughly [0.7, 1.2] (not exactly 1: fast convergence of the small ones
matters more than exactness, which the training does not need)."""


def orthogonalize(matrix: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """`matrix` with its singular values replaced by about 1, by a Newton-Schulz iteration.

    Works on the wide orientation (rows <= columns) so the Gram matrix is the small one; scaling by the
    Frobenius norm first bounds the spectral norm by 1, where the iteration converges.
    """
    a, b, c = NEWTON_SCHULZ_COEFFICIENTS
    tall = matrix.shape[0] > matrix.shape[1]
    x = matrix.T if tall else matrix
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """Muon on the groups marked `orthogonal`, Nesterov-capable SGD on the others.

    Group keys: `lr` (set each step by `optim.set_lr` from `lr_scale` x the schedule), `momentum`,
    `nesterov`, `weight_decay` (SGD groups only, coupled as in torch's SGD), `orthogonal`.
    """

    def __init__(self, groups: Iterable[dict[str, Any]], momentum: float, nesterov: bool) -> None:
        defaults = {
            "lr": 0.0,
            "lr_scale": 1.0,
            "momentum": momentum,
            "nesterov": nesterov,
            "weight_decay": 0.0,
            "orthogonal": False,
        }
        super().__init__(list(groups), defaults)

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        gradient = param.grad
        assert gradient is not None
        if not group["orthogonal"] and group["weight_decay"]:
            gradient = gradient.add(param, alpha=group["weight_decay"])
        state = self.state[param]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(param)
        buffer = state["momentum_buffer"]
        buffer.mul_(group["momentum"]).add_(gradient)
        direction = gradient.add(buffer, alpha=group["momentum"]) if group["nesterov"] else buffer
        if group["orthogonal"]:
            param.mul_(len(param) ** 0.5 / param.norm().clamp_min(1e-12))
            direction = orthogonalize(direction.reshape(len(param), -1)).view_as(param)
        param.add_(direction, alpha=-group["lr"])
