"""The training run: `build_trainer` assembles the parts in `components`, and `Trainer` runs the epochs by
calling them.

The process-level concerns (config parsing, process group life cycle, exit codes) live in `cli`; this
module assumes the process group, if any, is already initialised.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kubetrain_trainer import heartbeat, optim
from kubetrain_trainer.components import placement, resume
from kubetrain_trainer.components.checkpointing import CheckpointManager, run_identity
from kubetrain_trainer.components.evaluator import Evaluator
from kubetrain_trainer.components.training_data import TrainingData, load_training_data
from kubetrain_trainer.components.training_loop import TrainingLoop
from kubetrain_trainer.components.training_state import CheckpointedState, initial_state
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.metrics import ClassReport
from kubetrain_trainer.progress import PodAnnotator, ProgressReporter, progress_record

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a finished run leaves behind (rank 0 fills `job_dir` with the artifacts)."""

    job_dir: Path
    history: list[dict[str, Any]]
    report: ClassReport


def build_trainer(
    config: TrainerConfig, world: WorldEnv, job_name: str, job_uid: str = "", restart_attempt: int = 0
) -> Trainer:
    """Assemble the run's parts in the order every rank must keep: the seed before the model's random
    initialisation, the resume broadcast before DDP's broadcast of rank 0's parameters.

    The loop, the evaluator and checkpointing share one progress tick; the pod's heartbeat, when the
    operator asked for one, starts once the run knows the step it resumed at."""
    job_dir = Path(config.output_dir) / job_name
    device, dtype = placement.prepare(config, world)
    torch.manual_seed(config.seed)
    data = load_training_data(config, world, device)
    state = initial_state(config, data, device)
    length = optim.run_length(len(data.loader), config.epochs)
    identity = run_identity(config, world, job_uid, data.classes, data.global_batch)
    tick = heartbeat.ProgressTick()
    checkpoints = CheckpointManager.for_run(
        config, world, device, job_dir, identity, restart_attempt=restart_attempt, tick=tick
    )
    resumed_from = resume.resume(
        checkpoints, state, world=world, length=length, restart_attempt=restart_attempt
    )
    tick(state.progress.step)
    annotator = PodAnnotator.from_environment()
    heartbeat.start(world, tick, annotator)
    network = placement.wrap_for_training(state.model, config, world, device)
    loop = TrainingLoop(
        config=config,
        world=world,
        network=network,
        state=state,
        loader=data.loader,
        length=length,
        checkpoints=checkpoints,
        device=device,
        dtype=dtype,
        tick=tick,
    )
    evaluator = Evaluator(
        config=config, world=world, model=state.model, data=data, device=device, dtype=dtype, tick=tick
    )
    reporter = ProgressReporter(job_dir, annotator) if world.is_main else None
    return Trainer(config, world, job_dir, data, state, checkpoints, loop, evaluator, reporter, resumed_from)


@dataclass
class Trainer:
    """Trains the remaining epochs on this rank's share of the data; rank 0 writes checkpoints, progress and
    the artifacts. `build_trainer` makes one."""

    config: TrainerConfig
    world: WorldEnv
    job_dir: Path
    data: TrainingData
    state: CheckpointedState
    checkpoints: CheckpointManager
    loop: TrainingLoop
    evaluator: Evaluator
    reporter: ProgressReporter | None
    """Rank 0's: the others publish no progress."""
    resumed_from: dict[str, int] | None

    @property
    def model(self) -> nn.Module:
        """The trained module itself, not its DDP wrapper: what model.pt and the checkpoints hold."""
        return self.state.model

    def train(self) -> TrainResult:
        """Run the remaining epochs, then (rank 0) write the final artifacts."""
        loop, progress = self.loop, self.state.progress
        length = loop.length
        log.info(
            "training %s on %d images (%d validation), %d classes, %g epochs (%d steps of %d per epoch), "
            "global batch %d, device %s in %s",
            self.config.model,
            len(self.data.train),
            len(self.data.validation),
            len(self.data.classes),
            self.config.epochs,
            length.total_steps,
            length.steps_per_epoch,
            self.data.global_batch,
            loop.device,
            str(loop.dtype).removeprefix("torch."),
        )
        self.checkpoints.start_clock()
        if self.resumed_from is not None and self.reporter is not None:
            self.reporter.report(resume.resume_record(progress, length.epochs, self.resumed_from))
        report: ClassReport | None = None
        for epoch in range(progress.epoch + 1, length.epochs + 1):
            report = self._epoch(epoch)
        if report is None:  # nothing left to train: recompute the final report
            _, report = self.evaluator.validate()
        self.checkpoints.wait()
        if self.world.is_main:
            self.evaluator.write_artifacts(self.job_dir, progress.history, report)
        return TrainResult(self.job_dir, progress.history, report)

    def _epoch(self, epoch: int) -> ClassReport:
        """Train and validate `epoch`, record it in the history, checkpoint when due and publish progress."""
        progress, length = self.state.progress, self.loop.length
        started = time.perf_counter()
        steps = max(0, length.steps_in(epoch) - progress.epoch_step)
        trained = self.loop.train_epoch(epoch)
        train_seconds = time.perf_counter() - started
        val_loss, report = self.evaluator.validate()
        progress.finish_epoch(epoch)
        images_per_second = steps * self.data.global_batch / train_seconds
        # Without a validation split nothing was measured: null in the history and progress, not 0.0.
        val_accuracy = None if val_loss is None else report.accuracy
        progress.history.append(
            {
                "epoch": epoch,
                "train_loss": round(trained.loss, 6),
                "train_accuracy": round(trained.accuracy, 6),
                "val_loss": None if val_loss is None else round(val_loss, 6),
                "val_accuracy": None if val_accuracy is None else round(val_accuracy, 6),
                "lr": self.state.optimizer.param_groups[0]["lr"],
                "images_per_second": round(images_per_second, 1),
                "train_seconds": round(train_seconds, 3),
                "seconds": round(time.perf_counter() - started, 3),
            }
        )
        validated = "no validation split"
        if val_loss is not None:
            validated = f"validation loss {val_loss:.4f} acc {report.accuracy:.4f}"
        log.info(
            "epoch %d/%d done: train loss %.4f acc %.4f, %s, %.0f img/s",
            epoch,
            length.epochs,
            trained.loss,
            trained.accuracy,
            validated,
            images_per_second,
        )
        checkpoint_every = self.config.checkpoint_every_epochs
        if trained.checkpoint_due or epoch % checkpoint_every == 0 or epoch == length.epochs:
            self.checkpoints.save(self.state)
        if self.reporter is not None:
            self.reporter.report(
                progress_record(
                    epoch,
                    length.epochs,
                    progress.step,
                    loss=trained.loss,
                    accuracy=val_accuracy,
                    validation_loss=val_loss,
                    images_per_second=images_per_second,
                    resumed_from=self.resumed_from,
                )
            )
        return report
