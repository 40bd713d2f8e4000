"""Lookahead over an exponential moving average of the weights, as the CIFAR-10 speed runs use it.

Every `every_steps` optimizer steps the average moves towards the network's current floating-point state
(weights and batch-norm statistics) and the network is reset to the average. The averaging strength grows
with the cube of training progress, from none at the start (early weights are worth forgetting) to
`final_decay` at the end, and the last update copies the average into the network, so the saved model is
the averaged one. Averaging damps the noise of the high learning rates a short schedule needs, which is
worth about as much accuracy as extra epochs would be at the end of a run.

The decay is a pure function of the step, so a resumed run continues it from the restored step; the
average itself is checkpointed (`state_dict`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Lookahead:
    """The moving average of `model`'s floating-point state and the rule for when and how it updates."""

    def __init__(self, model: nn.Module, every_steps: int = 5, final_decay: float = 0.95**5) -> None:
        self.model = model
        self.every_steps = every_steps
        self.final_decay = final_decay
        self.average = {name: value.detach().clone() for name, value in self._tracked().items()}

    def _tracked(self) -> dict[str, torch.Tensor]:
        return {name: value for name, value in self.model.state_dict().items() if value.is_floating_point()}

    def decay_at(self, step: int, total_steps: int) -> float:
        """Weight of the old average after `step` optimizer steps of `total_steps`: cubic ramp to final."""
        progress = min(1.0, step / max(1, total_steps))
        return self.final_decay * progress**3

    @torch.no_grad()
    def after_step(self, step: int, total_steps: int) -> None:
        """Call after optimizer step number `step` (1-based); updates every `every_steps` and at the end."""
        if step >= total_steps:
            self._update(1.0)
        elif step % self.every_steps == 0:
            self._update(self.decay_at(step, total_steps))

    def _update(self, decay: float) -> None:
        for name, value in self._tracked().items():
            average = self.average[name]
            average.lerp_(value, 1.0 - decay)
            value.copy_(average)

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state["average"].items():
            self.average[name].copy_(value)
