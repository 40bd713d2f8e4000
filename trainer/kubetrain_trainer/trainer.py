"""The training loop: a `Trainer` that wires the data, model, optimiser, checkpointer and reporters.

The process-level concerns (config parsing, process group life cycle, exit codes) live in `cli`; this
module assumes the process group, if any, is already initialised.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kubetrain_trainer import (
    artifacts,
    batches,
    checkpoints,
    datasets,
    evaluation,
    memory,
    models,
    optim,
    plots,
    precision,
    provenance,
)
from kubetrain_trainer import config as config_module
from kubetrain_trainer.checkpoint_trigger import CheckpointTrigger
from kubetrain_trainer.checkpoints import Checkpointer
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.failures import ConfigError
from kubetrain_trainer.lookahead import Lookahead
from kubetrain_trainer.meter import ThroughputMeter
from kubetrain_trainer.metrics import ClassReport
from kubetrain_trainer.preprocessing import Preprocessing, fit_preprocessing
from kubetrain_trainer.progress import PodAnnotator, ProgressReporter, progress_record

log = logging.getLogger(__name__)

_EVAL_BATCH = 1024
_WHITENING_IMAGES = 5000


def select_device(config: TrainerConfig, world: WorldEnv) -> torch.device:
    """cuda:LOCAL_RANK when GPUs are requested or (auto) visible, else the CPU; checks GPUs suffice."""
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if not use_cuda:
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        raise ConfigError("device cuda requested but no GPU is visible (torch.cuda.device_count() == 0)")
    if world.local_world_size > count:
        raise ConfigError(
            f"LOCAL_WORLD_SIZE({world.local_world_size}) processes per worker but only {count} visible GPUs"
        )
    return torch.device("cuda", world.local_rank)


def cpu_threads(config: TrainerConfig, world: WorldEnv) -> int:
    """Intra-op threads for this process: the configured count, or the worker's cores split evenly."""
    if config.cpu_threads:
        return config.cpu_threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // world.local_world_size)


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
class TrainResult:
    """What a finished run leaves behind (rank 0 fills `job_dir` with the artifacts)."""

    job_dir: Path
    history: list[dict[str, Any]]
    report: ClassReport


def _all_reduce_sum(values: torch.Tensor, distributed: bool) -> torch.Tensor:
    if distributed:
        import torch.distributed as dist

        dist.all_reduce(values)
    return values


class Trainer:
    """Trains `config` on this rank's share of the data and, on rank 0, writes checkpoints and artifacts."""

    def __init__(
        self,
        config: TrainerConfig,
        world: WorldEnv,
        job_name: str,
        job_uid: str = "",
        restart_attempt: int = 0,
    ) -> None:
        self.config = config
        self.world = world
        self.job_uid = job_uid
        self.restart_attempt = restart_attempt
        self.job_dir = Path(config.output_dir) / job_name
        self.device = select_device(config, world)
        self.dtype = precision.compute_dtype(config.precision, self.device)
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads(config, world))
            if self.dtype == torch.float32 and precision.cpu_has_amx() and world.is_main:
                log.info("this CPU has AMX: precision bf16 would train convolutions 2-3x faster than fp32")
        else:
            torch.cuda.set_device(self.device)
            torch.backends.cudnn.benchmark = True
        torch.manual_seed(config.seed)

        budget = memory.DataBudget(
            memory.memory_limit_bytes(), world.local_world_size, config.data.image_size, config.augment
        )
        full = datasets.load(config.data, config.seed, budget)
        self.train_data, self.val_data = datasets.split_validation(full, config.data.validation_fraction)
        self.classes = full.classes
        self.data_origin = full.origin
        self.preprocessing: Preprocessing = fit_preprocessing(self.train_data.images, config.data.image_size)
        self.loader = batches.BatchLoader(
            self.train_data,
            self.preprocessing,
            batch_size=world.per_rank_batch(config.batch_size),
            rank=world.rank,
            world_size=world.world_size,
            seed=config.seed,
            augment=config.augment,
            device=self.device,
            crop_padding=config.crop_padding,
            flip=config.flip,
        )
        # Each rank validates a strided shard with rank 0's buffers (the saved model); confusion matrices
        # and loss sums are added across ranks.
        self.val_shard = self.val_data.subset(torch.arange(world.rank, len(self.val_data), world.world_size))

        self.model = models.build(config.model, len(self.classes), config.width)
        if isinstance(self.model, models.WhitenedCNN):  # a resumed run restores the fitted filters
            self.model.fit_whitening(self._whitening_sample())
        self.model.to(self.device).to(memory_format=torch.channels_last)
        self.optimizer = optim.build_optimizer(self.model, config.optimizer)
        self.lookahead = Lookahead(self.model) if config.optimizer.lookahead else None
        self.state = TrainState()
        self.checkpointer = Checkpointer(self.job_dir / "checkpoints", config.keep_checkpoints)
        self.resumed_from = self._resume()
        self.network: nn.Module = self.model
        if world.distributed:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.network = DistributedDataParallel(self.model, device_ids=device_ids)
        if config.compile:
            self.network = torch.compile(self.network)  # type: ignore[assignment]
        self.reporter = (
            ProgressReporter(self.job_dir, PodAnnotator.from_environment()) if world.is_main else None
        )

    def _whitening_sample(self) -> torch.Tensor:
        """Evenly spaced normalised training images (at most 5,000: the 12x12 patch covariance of that
        many is already stable), the same on every rank."""
        images = self.train_data.images
        chosen = images[:: max(1, len(images) // _WHITENING_IMAGES)][:_WHITENING_IMAGES]
        return self.preprocessing.normalize(chosen)

    def _components(self) -> dict[str, Any]:
        components = {"model": self.model, "optimizer": self.optimizer, "state": self.state}
        if self.lookahead is not None:
            components["lookahead"] = self.lookahead
        return components

    def _identity(self) -> dict[str, Any]:
        """What a checkpoint must share with this run to be resumed (see `checkpoints.resume_mismatch`)."""
        return {
            "job_uid": self.job_uid,
            "classes": list(self.classes),
            "config": config_module.resume_identity(self.config),
            "world_size": self.world.world_size,
            "global_batch": self.loader.batch_size * self.world.world_size,
        }

    def _length(self) -> optim.RunLength:
        """This run's steps and epochs at its world size (a resize changes the steps per epoch)."""
        return optim.run_length(len(self.loader), self.config.epochs)

    def _resumable_checkpoint(self) -> Path | None:
        """Rank 0's choice: the newest valid checkpoint if this job and config wrote it, else a fresh start.

        The directory is keyed by the job's name, which a new TrainingJob may reuse; another job's (or
        config's) checkpoints are deleted so that later restarts of this job never pick them up.
        """
        path = self.checkpointer.newest_valid()
        if path is None:
            return None
        why = checkpoints.resume_mismatch(
            self.checkpointer.read_header(path), self._identity(), self._length().epochs
        )
        if why is None:
            return path
        removed = self.checkpointer.discard()
        log.warning(
            "not resuming from checkpoint %s: %s; starting fresh (removed %d old checkpoints)",
            path,
            why,
            len(removed),
        )
        return None

    def _resume(self) -> dict[str, int] | None:
        """Load the newest resumable checkpoint (rank 0 chooses, every rank loads).

        Returns where training resumes, `{"attempt", "epoch", "step"}` as progress reports it, or None for
        a fresh start.
        """
        choice: list[str | None] = [None]
        if self.world.is_main:
            path = self._resumable_checkpoint()
            choice[0] = str(path) if path else None
        if self.world.distributed:
            import torch.distributed as dist

            dist.broadcast_object_list(choice, src=0)
        if choice[0] is None:
            return None
        header = self.checkpointer.load(Path(choice[0]), self._components())
        state = self.state
        steps_per_epoch = len(self.loader)
        if state.epoch_step:
            current = self._identity()
            step = checkpoints.equivalent_epoch_step(header, current, state.epoch_step)
            if step != state.epoch_step:
                log.warning(
                    "the checkpoint was written by %s processes (global batch %s), this run has %d (%d): "
                    "epoch %d continues at step %d of %d, the nearest to the %d steps done before",
                    header.get("world_size"),
                    header.get("global_batch", "unknown"),
                    self.world.world_size,
                    current["global_batch"],
                    state.last_step_epoch,
                    min(step, steps_per_epoch),
                    steps_per_epoch,
                    state.epoch_step,
                )
                state.epoch_step = min(step, steps_per_epoch)
        log.info(
            "resumed from checkpoint %s in restart attempt %d: epoch %d of %d, step %d "
            "(%d of %d steps of epoch %d done)",
            choice[0],
            self.restart_attempt,
            state.last_step_epoch,
            self._length().epochs,
            state.step,
            state.epoch_step or steps_per_epoch,
            steps_per_epoch,
            state.last_step_epoch,
        )
        return {"attempt": self.restart_attempt, "epoch": state.last_step_epoch, "step": state.step}

    def _checkpoint(self, trigger: CheckpointTrigger) -> None:
        """Every rank calls this at the same step; rank 0 copies the state and writes it in the background."""
        trigger.restart()
        if not self.world.is_main:
            return
        state = self.state
        extra = {**self._identity(), "epoch_step": state.epoch_step}
        started = time.perf_counter()
        path = self.checkpointer.save_in_background(
            state.last_step_epoch, state.step, self._components(), extra
        )
        log.info(
            "checkpoint %s: training paused %.3fs to copy the state, writing it in the background",
            path.name,
            time.perf_counter() - started,
        )

    def _checkpoint_mid_epoch(
        self, loss_sum: torch.Tensor, correct: torch.Tensor, seen: int, trigger: CheckpointTrigger
    ) -> None:
        """Record the partial epoch's totals over all ranks, then checkpoint (a collective: every rank)."""
        partial = torch.stack(
            [loss_sum, correct.double(), torch.tensor(float(seen), device=self.device, dtype=torch.float64)]
        )
        self.state.epoch_totals = _all_reduce_sum(partial, self.world.distributed).tolist()
        self._checkpoint(trigger)

    def _report_resume(self) -> None:
        """Tell the operator at once where this attempt resumed, not only when its first epoch ends."""
        assert self.reporter is not None
        last = self.state.history[-1] if self.state.history else {}
        self.reporter.report(
            progress_record(
                self.state.epoch,
                self._length().epochs,
                self.state.step,
                loss=last.get("train_loss"),
                accuracy=last.get("val_accuracy"),
                validation_loss=last.get("val_loss"),
                resumed_from=self.resumed_from,
            )
        )

    def train(self) -> TrainResult:
        """Run the remaining epochs, then (rank 0) write the final artifacts."""
        config = self.config
        length = self._length()
        criterion = nn.CrossEntropyLoss(label_smoothing=config.optimizer.label_smoothing)
        meter = ThroughputMeter(
            length=length,
            global_batch=self.loader.batch_size * self.world.world_size,
            log_every=config.log_every_steps,
            enabled=self.world.is_main,
        )
        log.info(
            "training %s on %d images (%d validation), %d classes, %g epochs (%d steps of %d per epoch), "
            "global batch %d, device %s in %s",
            config.model,
            len(self.train_data),
            len(self.val_data),
            len(self.classes),
            config.epochs,
            length.total_steps,
            length.steps_per_epoch,
            self.loader.batch_size * self.world.world_size,
            self.device,
            str(self.dtype).removeprefix("torch."),
        )
        report = ClassReport(
            self.classes, torch.zeros(len(self.classes), len(self.classes), dtype=torch.int64)
        )
        trigger = CheckpointTrigger(
            every_steps=config.checkpoint_every_steps,
            every_seconds=config.checkpoint_every_seconds,
            distributed=self.world.distributed,
            device=self.device,
        )
        if self.resumed_from is not None and self.world.is_main:
            self._report_resume()
        first_epoch = self.state.epoch + 1
        for epoch in range(first_epoch, length.epochs + 1):
            started = time.perf_counter()
            meter.start_window()
            steps = max(0, length.steps_in(epoch) - self.state.epoch_step)
            train_loss, train_acc, due = self._train_epoch(
                epoch, length, criterion, meter=meter, trigger=trigger
            )
            train_seconds = time.perf_counter() - started
            val_loss, report = self._validate()
            self.state.finish_epoch(epoch)
            self.state.history.append(
                {
                    "epoch": epoch,
                    "train_loss": round(train_loss, 6),
                    "train_accuracy": round(train_acc, 6),
                    "val_loss": round(val_loss, 6),
                    "val_accuracy": round(report.accuracy, 6),
                    "lr": self.optimizer.param_groups[0]["lr"],
                    "images_per_second": round(steps * meter.global_batch / train_seconds, 1),
                    "train_seconds": round(train_seconds, 3),
                    "seconds": round(time.perf_counter() - started, 3),
                }
            )
            log.info(
                "epoch %d/%d done: train loss %.4f acc %.4f, validation loss %.4f acc %.4f, %.0f img/s",
                epoch,
                length.epochs,
                train_loss,
                train_acc,
                val_loss,
                report.accuracy,
                steps * meter.global_batch / train_seconds,
            )
            if due or epoch % config.checkpoint_every_epochs == 0 or epoch == length.epochs:
                self._checkpoint(trigger)
            if self.world.is_main:
                assert self.reporter is not None
                self.reporter.report(
                    progress_record(
                        epoch,
                        length.epochs,
                        self.state.step,
                        loss=train_loss,
                        accuracy=report.accuracy,
                        validation_loss=val_loss,
                        resumed_from=self.resumed_from,
                    )
                )
        if first_epoch > length.epochs:  # nothing left to train: recompute the final report
            _, report = self._validate()
        self.checkpointer.wait()
        if self.world.is_main:
            self._write_artifacts(report)
        return TrainResult(self.job_dir, self.state.history, report)

    def _train_epoch(
        self,
        epoch: int,
        length: optim.RunLength,
        criterion: nn.Module,
        *,
        meter: ThroughputMeter,
        trigger: CheckpointTrigger,
    ) -> tuple[float, float, bool]:
        """Train the rest of `epoch`; returns its loss and accuracy over all ranks, and whether the trigger
        asked for a checkpoint at its last step (taken after validation, with the epoch's history)."""
        steps_per_epoch, total_steps = length.steps_per_epoch, length.total_steps
        epoch_steps = length.steps_in(epoch)
        self.network.train()
        self.loader.set_epoch(epoch, self.state.epoch_step)
        # The partial epoch's totals are over all ranks: rank 0 carries them, the others start from 0.
        carried = self.state.epoch_totals if self.world.is_main else _no_totals()
        loss_sum = torch.tensor(carried[0], device=self.device, dtype=torch.float64)
        correct = torch.tensor(int(carried[1]), device=self.device, dtype=torch.int64)
        seen = int(carried[2])
        due_at_end = False
        for images, labels in self.loader:
            if self.state.epoch_step >= epoch_steps:  # a fractional run's last epoch ends early
                break
            factor = optim.lr_factor(self.config.optimizer, self.state.step, total_steps, steps_per_epoch)
            optim.set_lr(self.optimizer, self.config.optimizer.lr, factor)
            with precision.autocast(self.device, self.dtype):
                outputs = self.network(images)
            loss = criterion(outputs.float(), labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.state.step += 1
            if self.lookahead is not None:
                self.lookahead.after_step(self.state.step, total_steps)
            self.state.epoch_step += 1
            loss_sum += loss.detach() * len(labels)
            correct += (outputs.detach().argmax(dim=1) == labels).sum()
            seen += len(labels)
            meter.step(epoch, self.state.epoch_step - 1, self.state.step - 1, loss.detach())
            if trigger.due(self.state.step):
                if self.state.epoch_step < epoch_steps:
                    self._checkpoint_mid_epoch(loss_sum, correct, seen, trigger)
                else:
                    due_at_end = True
        totals = torch.stack(
            [loss_sum, correct.double(), torch.tensor(float(seen), device=self.device).double()]
        )
        totals = _all_reduce_sum(totals, self.world.distributed)
        return float(totals[0] / totals[2]), float(totals[1] / totals[2]), due_at_end

    def _adopt_main_buffers(self) -> None:
        """Give every rank rank 0's buffers (batch-norm running statistics): the model rank 0 saves.

        DDP keeps parameters identical but each rank's last training forward updates its own running
        statistics, so a shard validated with them would not be the accuracy of `model.pt`.
        """
        if not self.world.distributed:
            return
        import torch.distributed as dist

        for buffer in self.model.buffers():
            dist.broadcast(buffer, src=0)

    def _validate(self) -> tuple[float, ClassReport]:
        self._adopt_main_buffers()
        # The plain module, not the DDP wrapper: DDP's forward broadcasts buffers, a collective that would
        # deadlock when the ranks' validation shards differ by one batch.
        result = evaluation.evaluate(
            self.model,
            self.val_shard,
            self.preprocessing,
            device=self.device,
            batch_size=_EVAL_BATCH,
            flip_tta=self.config.eval_flip_tta,
            translate_tta=self.config.eval_translate_tta,
            dtype=self.dtype,
        )
        packed = torch.cat(
            [
                result.matrix.flatten().double(),
                torch.tensor([result.loss_sum, float(result.count)], dtype=torch.float64),
            ]
        ).to(self.device)
        packed = _all_reduce_sum(packed, self.world.distributed).cpu()
        n = len(self.classes)
        matrix = packed[: n * n].round().long().view(n, n)
        loss = float(packed[-2] / packed[-1]) if packed[-1] > 0 else 0.0
        return loss, ClassReport(self.classes, matrix)

    def _write_artifacts(self, report: ClassReport) -> None:
        job_dir = self.job_dir
        record = provenance.record(self.config, self.data_origin, len(self.train_data), len(self.val_data))
        artifacts.save_model(
            job_dir / artifacts.MODEL_FILE,
            self.model,
            self.config,
            self.classes,
            self.preprocessing,
            provenance=record,
        )
        artifacts.write_metrics(
            job_dir / artifacts.METRICS_FILE, self.state.history, report.to_dict(), record
        )
        if self.state.history:
            plots.loss_curve(job_dir / "loss_curve.png", self.state.history)
        plots.confusion_matrix(job_dir / "confusion_matrix.png", report.matrix, self.classes)
        # Evenly spaced validation images: the split is ordered by class, so this shows many classes.
        sample = self.val_data.subset(torch.linspace(0, len(self.val_data) - 1, 16).long().unique())
        if len(sample):
            predicted = evaluation.evaluate(
                self.model, sample, self.preprocessing, device=self.device, batch_size=16, dtype=self.dtype
            ).predictions
            plots.prediction_grid(
                job_dir / "predictions.png", sample.images, sample.labels, predicted, self.classes
            )
        log.info("validation per-class report:\n%s", report.table())
        log.info("artifacts written to %s", job_dir)
