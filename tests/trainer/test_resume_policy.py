"""Where a restarted run continues: nothing without a checkpoint, the checkpoint's position at the same
global batch, the step with as many images seen when the world size changed it, and a progress record
that says so before the first epoch ends."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from kubetrain_trainer import optim
from kubetrain_trainer.components import resume
from kubetrain_trainer.components.checkpointing import CheckpointManager, run_identity
from kubetrain_trainer.components.training_state import CheckpointedState, TrainState
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv

pytestmark = pytest.mark.unit

CONFIG = TrainerConfig(epochs=2)


def _manager(job_dir: Path, world_size: int, global_batch: int) -> CheckpointManager:
    # The identity of a run at another world size; this process itself is a single rank.
    identity = {**run_identity(CONFIG, WorldEnv(), "uid", ["a", "b"], global_batch), "world_size": world_size}
    return CheckpointManager.for_run(CONFIG, WorldEnv(), torch.device("cpu"), job_dir, identity)


def _state(**progress: int) -> CheckpointedState:
    model = torch.nn.Linear(2, 2)
    return CheckpointedState(model, torch.optim.SGD(model.parameters(), lr=0.1), None, TrainState(**progress))


def _resume(
    manager: CheckpointManager, state: CheckpointedState, steps_per_epoch: int
) -> dict[str, int] | None:
    length = optim.run_length(steps_per_epoch, CONFIG.epochs)
    return resume.resume(manager, state, world=WorldEnv(), length=length, restart_attempt=1)


def _checkpoint_mid_epoch(job_dir: Path, world_size: int, global_batch: int) -> None:
    writer = _manager(job_dir, world_size, global_batch)
    writer.save(_state(epoch=0, step=6, epoch_step=6))
    writer.wait()


def test_a_run_without_checkpoints_starts_fresh(tmp_path: Path) -> None:
    state = _state()
    assert _resume(_manager(tmp_path, 1, 8), state, steps_per_epoch=8) is None
    assert state.progress == TrainState()


def test_the_same_global_batch_continues_at_the_checkpoints_step(tmp_path: Path) -> None:
    _checkpoint_mid_epoch(tmp_path, world_size=1, global_batch=8)
    state = _state()
    resumed = _resume(_manager(tmp_path, 2, 8), state, steps_per_epoch=8)
    assert resumed == {"attempt": 1, "epoch": 1, "step": 6}
    assert state.progress.epoch_step == 6


def test_a_larger_global_batch_continues_at_the_step_with_as_many_images_seen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _checkpoint_mid_epoch(tmp_path, world_size=1, global_batch=8)
    state = _state()
    with caplog.at_level(logging.INFO):
        resumed = _resume(_manager(tmp_path, 2, 16), state, steps_per_epoch=4)
    assert resumed == {"attempt": 1, "epoch": 1, "step": 6}
    assert state.progress.epoch_step == 3
    assert "epoch 1 continues at step 3 of 4, the nearest to the 6 steps done before" in caplog.text
    assert "in restart attempt 1: epoch 1 of 2, step 6 (3 of 4 steps of epoch 1 done)" in caplog.text


def test_a_remapped_position_never_passes_the_epochs_end(tmp_path: Path) -> None:
    _checkpoint_mid_epoch(tmp_path, world_size=2, global_batch=16)
    state = _state()
    _resume(_manager(tmp_path, 1, 8), state, steps_per_epoch=10)
    assert state.progress.epoch_step == 10  # 12 steps of 8 images cover what 6 of 16 did; the epoch has 10


def test_a_resumed_attempt_reports_the_last_completed_epochs_figures() -> None:
    progress = TrainState(
        epoch=1,
        step=8,
        history=[{"train_loss": 1.5, "val_loss": 1.75, "val_accuracy": 0.5, "images_per_second": 800.0}],
    )
    record = resume.resume_record(progress, 3, {"attempt": 2, "epoch": 1, "step": 8})
    assert (record["epoch"], record["epochs"], record["step"]) == (1, 3, 8)
    assert (record["loss"], record["validationLoss"], record["accuracy"]) == (1.5, 1.75, 0.5)
    assert record["imagesPerSecond"] == 800.0
    assert record["resumedFrom"] == {"attempt": 2, "epoch": 1, "step": 8}
