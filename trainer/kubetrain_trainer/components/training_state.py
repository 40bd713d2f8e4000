"""What a checkpoint holds: the model, its optimiser, the lookahead average and the run's progress counters.

The checkpoint file stores each of them under its own key (`CheckpointedState.components`); the keys and
their order are the file format, which resumed runs and older checkpoints rely on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from kubetrain_trainer import models, optim
from kubetrain_trainer.components.training_data import TrainingData
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.lookahead import Lookahead


def _no_totals() -> list[float]:
    return [0.0, 0.0, 0.0]


@dataclass
class TrainState:
    """Progress counters, the epoch in progress and the per-epoch history, checkpointed with the model.

    `epoch` counts completed epochs and `step` optimizer steps of the whole run; `epoch_step` is how many
    steps of the next epoch are done (0 at an epoch boundary) and `epoch_totals` that partial epoch's
    training loss sum, correct predictions and images over all ranks, so a run resumed mid-epoch reports
    the same epoch loss as one never interrupted. Checkpoints older than mid-epoch ones lack both: 0.
    """

    epoch: int = 0
    step: int = 0
    epoch_step: int = 0
    epoch_totals: list[float] = field(default_factory=_no_totals)
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last_step_epoch(self) -> int:
        """The epoch (1-based) the latest step belongs to: the one in progress, else the last completed."""
        return self.epoch + 1 if self.epoch_step else self.epoch

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "epoch_step": self.epoch_step,
            "epoch_totals": list(self.epoch_totals),
            "history": list(self.history),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.step = int(state["step"])
        self.epoch_step = int(state.get("epoch_step", 0))
        self.epoch_totals = [float(v) for v in state.get("epoch_totals", _no_totals())]
        self.history = list(state["history"])

    def finish_epoch(self, epoch: int) -> None:
        """`epoch` is complete: the next one starts from its first step with empty totals."""
        self.epoch = epoch
        self.epoch_step = 0
        self.epoch_totals = _no_totals()


@dataclass
class CheckpointedState:
    """The run's state that a restarted process must get back; everything else is rebuilt from the config."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    lookahead: Lookahead | None
    progress: TrainState

    def components(self) -> dict[str, Any]:
        """The checkpoint's keys and what each restores (`lookahead` only in runs that use it)."""
        components: dict[str, Any] = {
            "model": self.model,
            "optimizer": self.optimizer,
            "state": self.progress,
        }
        if self.lookahead is not None:
            components["lookahead"] = self.lookahead
        return components


def initial_state(config: TrainerConfig, data: TrainingData, device: torch.device) -> CheckpointedState:
    """A fresh model (its random initialisation draws from the seeded global generator) and optimiser.

    A whitened model's filters are fitted here even when a checkpoint will replace them: the fit is
    deterministic and cheap, and the model is whole whether or not a checkpoint exists.
    """
    model = models.build(config.model, len(data.classes), config.width, config.identity_init)
    if isinstance(model, models.WhitenedCNN):
        model.fit_whitening(data.whitening_sample())
    model.to(device).to(memory_format=torch.channels_last)
    optimizer = optim.build_optimizer(model, config.optimizer)
    lookahead = Lookahead(model) if config.optimizer.lookahead else None
    return CheckpointedState(model, optimizer, lookahead, TrainState())
