"""Validation during training, summed over all ranks' shards, and the artifacts rank 0 writes at the end.

Each rank validates its shard with rank 0's buffers, so the report is that of the model rank 0 saves:
`kubetrain evaluate model.pt` on the validation split gives the same numbers, to the image.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kubetrain_trainer import artifacts, evaluation, heartbeat, plots, provenance
from kubetrain_trainer.components.training_data import TrainingData
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv, all_reduce_sum
from kubetrain_trainer.metrics import ClassReport

log = logging.getLogger(__name__)

EVAL_BATCH = 1024
"""Validation images per forward pass: with no gradients to keep, far more than a training batch fit."""


@dataclass(kw_only=True)
class Evaluator:
    """Validates `model` (the plain module, never its DDP wrapper) and writes the final artifacts."""

    config: TrainerConfig
    world: WorldEnv
    model: nn.Module
    data: TrainingData
    device: torch.device
    dtype: torch.dtype
    tick: heartbeat.ProgressTick = field(default_factory=heartbeat.ProgressTick)
    """Told of every validation batch (the heartbeat's progress: a long validation is no hang)."""

    def validate(self) -> tuple[float | None, ClassReport]:
        """The validation loss and per-class report over all ranks (collectives: every rank calls it).

        Without a validation split (`data.validation_fraction: 0`) the loss is None and the report's matrix
        empty: nothing was measured, which progress and metrics.json say as null, not as a loss of 0."""
        self._adopt_main_buffers()
        # The plain module, not the DDP wrapper: DDP's forward broadcasts buffers, a collective that would
        # deadlock when the ranks' validation shards differ by one batch.
        result = evaluation.evaluate(
            self.model,
            self.data.validation_shard,
            self.data.preprocessing,
            device=self.device,
            batch_size=EVAL_BATCH,
            flip_tta=self.config.eval_flip_tta,
            translate_tta=self.config.eval_translate_tta,
            dtype=self.dtype,
            on_batch=self.tick,
        )
        packed = torch.cat(
            [
                result.matrix.flatten().double(),
                torch.tensor([result.loss_sum, float(result.count)], dtype=torch.float64),
            ]
        ).to(self.device)
        packed = all_reduce_sum(packed, self.world).cpu()
        classes = self.data.classes
        n = len(classes)
        matrix = packed[: n * n].round().long().view(n, n)
        loss = float(packed[-2] / packed[-1]) if packed[-1] > 0 else None
        return loss, ClassReport(classes, matrix)

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

    def write_artifacts(self, job_dir: Path, history: list[dict[str, Any]], report: ClassReport) -> None:
        """model.pt, metrics.json and the figures (rank 0, after the last checkpoint is on disk)."""
        data, classes = self.data, self.data.classes
        record = provenance.record(self.config, data.origin, len(data.train), len(data.validation))
        artifacts.save_model(
            job_dir / artifacts.MODEL_FILE,
            self.model,
            self.config,
            classes,
            data.preprocessing,
            provenance=record,
        )
        artifacts.write_metrics(job_dir / artifacts.METRICS_FILE, history, report.to_dict(), record)
        if history:
            plots.loss_curve(job_dir / "loss_curve.png", history, self.config.optimizer.label_smoothing)
        plots.confusion_matrix(job_dir / "confusion_matrix.png", report.matrix, classes)
        # Evenly spaced validation images: the split is ordered by class, so this shows many classes. A run
        # without a validation split has nothing to show (and linspace would count down to index -1).
        if len(data.validation):
            sample = data.validation.subset(torch.linspace(0, len(data.validation) - 1, 16).long().unique())
            predicted = evaluation.evaluate(
                self.model, sample, data.preprocessing, device=self.device, batch_size=16, dtype=self.dtype
            ).predictions
            plots.prediction_grid(
                job_dir / "predictions.png", sample.images, sample.labels, predicted, classes
            )
            log.info("validation per-class report:\n%s", report.table())
        else:
            log.info("no validation split (data.validation_fraction 0): no per-class report")
        log.info("artifacts written to %s", job_dir)
