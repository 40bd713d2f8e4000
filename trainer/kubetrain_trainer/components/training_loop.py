"""The optimizer steps of one epoch on this rank: learning-rate schedule, lookahead, throughput lines,
the epoch's loss and accuracy over all ranks, and mid-epoch checkpoints when the trigger says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from kubetrain_trainer import batches, heartbeat, optim, precision
from kubetrain_trainer.components.checkpointing import CheckpointManager
from kubetrain_trainer.components.training_state import CheckpointedState
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv, all_reduce_sum
from kubetrain_trainer.meter import ThroughputMeter


class EpochOutcome(NamedTuple):
    """An epoch's training figures over all ranks, and whether the trigger asked for a checkpoint at its last
    step: that one is taken after validation, so that it holds the epoch's history."""

    loss: float
    accuracy: float
    checkpoint_due: bool


@dataclass(kw_only=True)
class TrainingLoop:
    """Trains the rest of an epoch through `network` (the DDP wrapper of `state.model`), advancing `state`."""

    config: TrainerConfig
    world: WorldEnv
    network: nn.Module
    state: CheckpointedState
    loader: batches.BatchLoader
    length: optim.RunLength
    checkpoints: CheckpointManager
    device: torch.device
    dtype: torch.dtype
    tick: heartbeat.ProgressTick = field(default_factory=heartbeat.ProgressTick)
    """Told of every optimizer step (the heartbeat's progress)."""
    criterion: nn.Module = field(init=False)
    meter: ThroughputMeter = field(init=False)

    def __post_init__(self) -> None:
        self.criterion = nn.CrossEntropyLoss(label_smoothing=self.config.optimizer.label_smoothing)
        self.meter = ThroughputMeter(
            length=self.length,
            global_batch=self.loader.batch_size * self.world.world_size,
            log_every=self.config.log_every_steps,
            enabled=self.world.is_main,
        )

    def train_epoch(self, epoch: int) -> EpochOutcome:
        """Train `epoch` from the step the progress counters say is next (a resumed epoch's middle)."""
        self.meter.start_window()
        progress, optimizer, lookahead = self.state.progress, self.state.optimizer, self.state.lookahead
        steps_per_epoch, total_steps = self.length.steps_per_epoch, self.length.total_steps
        epoch_steps = self.length.steps_in(epoch)
        self.network.train()
        self.loader.set_epoch(epoch, progress.epoch_step)
        # The partial epoch's totals are over all ranks: rank 0 carries them, the others start from 0.
        carried = progress.epoch_totals if self.world.is_main else [0.0, 0.0, 0.0]
        loss_sum = torch.tensor(carried[0], device=self.device, dtype=torch.float64)
        correct = torch.tensor(int(carried[1]), device=self.device, dtype=torch.int64)
        seen = int(carried[2])
        due_at_end = False
        for images, labels in self.loader:
            if progress.epoch_step >= epoch_steps:  # a fractional run's last epoch ends early
                break
            factor = optim.lr_factor(self.config.optimizer, progress.step, total_steps, steps_per_epoch)
            optim.set_lr(optimizer, self.config.optimizer.lr, factor)
            with precision.autocast(self.device, self.dtype):
                outputs = self.network(images)
            loss = self.criterion(outputs.float(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            progress.step += 1
            self.tick(progress.step)
            if lookahead is not None:
                lookahead.after_step(progress.step, total_steps)
            progress.epoch_step += 1
            loss_sum += loss.detach() * len(labels)
            correct += (outputs.detach().argmax(dim=1) == labels).sum()
            seen += len(labels)
            self.meter.step(epoch, progress.epoch_step - 1, progress.step - 1, loss.detach())
            if self.checkpoints.due(progress.step):
                if progress.epoch_step < epoch_steps:
                    partial = torch.stack(
                        [
                            loss_sum,
                            correct.double(),
                            torch.tensor(float(seen), device=self.device, dtype=torch.float64),
                        ]
                    )
                    self.checkpoints.save_mid_epoch(partial, self.state)
                else:
                    due_at_end = True
        totals = torch.stack(
            [loss_sum, correct.double(), torch.tensor(float(seen), device=self.device).double()]
        )
        totals = all_reduce_sum(totals, self.world)
        return EpochOutcome(float(totals[0] / totals[2]), float(totals[1] / totals[2]), due_at_end)
