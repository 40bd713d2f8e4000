"""Where a restarted run continues: nothing without a checkpoint, the checkpoint's position at the same
global batch, the step with as many images seen when the world size changed it, and a progress record
that says so before the first epoch ends."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from kubetrain_trainer import optim
from kubetrain_trainer.components import resume
from kubetrain_trainer.components.checkpointing import CheckpointManager, run_identity
from kubetrain_trainer.components.training_state import CheckpointedState, TrainState
from kubetrain_trainer.config import OptimizerConfig, TrainerConfig
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.lookahead import Lookahead

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


ONECYCLE = OptimizerConfig(schedule="onecycle", warmup_epochs=0.5, lookahead=True)


class Rest(NamedTuple):
    """What the steps left after a resume did with the schedule and lookahead."""

    factors: list[float]
    """The learning-rate factor of every step."""
    final_averaging: bool
    """Whether the last step ended in lookahead's final averaging, which copies the average into the
    network unchanged (a periodic update first moves the average towards the network): the saved model
    is the promised average."""


def _train_the_rest(state: CheckpointedState, length: optim.RunLength) -> Rest:
    """What `TrainingLoop` does with the schedule and lookahead over the steps left after a resume; `state`'s
    counters and network advance as the loop's do (each optimizer step moves the network off the average)."""
    progress, lookahead = state.progress, state.lookahead
    assert lookahead is not None
    factors: list[float] = []
    average_before_last: dict[str, torch.Tensor] = {}
    for epoch in range(progress.epoch + 1, length.epochs + 1):
        for _ in range(progress.epoch_step, length.steps_in(epoch)):
            factors.append(
                optim.lr_factor(ONECYCLE, progress.step, length.total_steps, length.steps_per_epoch)
            )
            with torch.no_grad():
                for param in state.model.parameters():
                    param.add_(1.0)
            progress.step += 1
            average_before_last = {name: value.clone() for name, value in lookahead.average.items()}
            lookahead.after_step(progress.step, length.total_steps)
        progress.finish_epoch(epoch)
    network = state.model.state_dict()
    final = all(torch.equal(network[name], value) for name, value in average_before_last.items())
    return Rest(factors, final)


def _lookahead_state(**progress: int) -> CheckpointedState:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return CheckpointedState(model, optimizer, Lookahead(model), TrainState(**progress))


def _resume_after_epoch_1(
    tmp_path: Path, old_global_batch: int, new_global_batch: int
) -> tuple[CheckpointedState, optim.RunLength]:
    """A 2-epoch run over 64 images, checkpointed at the end of epoch 1 by a group whose global batch was
    `old_global_batch` (a fixed-size group of 8 images per rank: its world size x 8), resumed by one whose
    global batch is `new_global_batch`; the resumed state and the run's length at the new size."""
    old_steps = 64 // old_global_batch
    writer = _manager(tmp_path, old_global_batch // 8, old_global_batch)
    writer.save(_lookahead_state(epoch=1, step=old_steps))
    writer.wait()
    state = _lookahead_state()
    length = optim.run_length(64 // new_global_batch, 2)
    manager = _manager(tmp_path, new_global_batch // 8, new_global_batch)
    resume.resume(manager, state, world=WorldEnv(), length=length, restart_attempt=1)
    return state, length


def test_a_grown_world_trains_its_last_epoch_on_the_schedule_and_ends_in_the_final_average(
    tmp_path: Path,
) -> None:
    # One process (global batch 8, 8 steps an epoch) checkpointed after epoch 1; two go on (16, 4 steps).
    state, length = _resume_after_epoch_1(tmp_path, old_global_batch=8, new_global_batch=16)
    assert state.progress.step == 4, "8 steps of 8 images are 4 steps of 16 of this run"
    rest = _train_the_rest(state, length)
    assert len(rest.factors) == 4 and min(rest.factors) > 0, (
        f"epoch 2 trained at learning rates {rest.factors}"
    )
    assert rest.factors == sorted(rest.factors, reverse=True)  # the one-cycle decay towards 0
    assert state.progress.step == length.total_steps
    assert rest.final_averaging


def test_a_shrunk_world_reaches_the_schedules_end_and_ends_in_the_final_average(tmp_path: Path) -> None:
    # Two processes (global batch 16, 4 steps an epoch) checkpointed after epoch 1; one goes on (8, 8 steps).
    state, length = _resume_after_epoch_1(tmp_path, old_global_batch=16, new_global_batch=8)
    assert state.progress.step == 8, "4 steps of 16 images are 8 steps of 8 of this run"
    rest = _train_the_rest(state, length)
    assert rest.factors[-1] == optim.lr_factor(ONECYCLE, 15, 16, 8), "the last step is the schedule's last"
    assert state.progress.step == length.total_steps == 16
    assert rest.final_averaging


def test_a_mid_epoch_position_remapped_to_another_global_batch_remaps_the_run_step_too(
    tmp_path: Path,
) -> None:
    _checkpoint_mid_epoch(tmp_path, world_size=1, global_batch=8)  # 6 steps of 8 images into epoch 1
    state = _state()
    resumed = _resume(_manager(tmp_path, 2, 16), state, steps_per_epoch=4)
    assert resumed == {"attempt": 1, "epoch": 1, "step": 6}, "progress reports the checkpoint's own count"
    assert (state.progress.epoch_step, state.progress.step) == (3, 3)
