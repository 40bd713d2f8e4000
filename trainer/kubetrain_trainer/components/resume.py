"""Where a restarted run continues: rank 0 chooses the checkpoint, every rank loads it, and a position in
the middle of an epoch is carried over to this run's world size.

An elastic group may come back with more or fewer workers; the checkpoint's state means the same at any
size, only its steps are counted in another global batch: the interrupted epoch's
(`checkpoints.equivalent_epoch_step`) and the run's, which the learning-rate schedule and lookahead read.
The operator learns where the attempt resumed from `resume_record` at once, not only when its first epoch
ends.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from kubetrain_trainer import checkpoints, optim
from kubetrain_trainer.components.checkpointing import CheckpointManager
from kubetrain_trainer.components.training_state import CheckpointedState, TrainState
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.progress import progress_record

log = logging.getLogger(__name__)


def resume(
    manager: CheckpointManager,
    state: CheckpointedState,
    *,
    world: WorldEnv,
    length: optim.RunLength,
    restart_attempt: int,
) -> dict[str, int] | None:
    """Load the newest resumable checkpoint into `state` (rank 0 chooses and broadcasts: a collective).

    Returns where training resumes, `{"attempt", "epoch", "step"}` as progress reports it (the checkpoint's
    own step count, comparable with the previous attempt's progress, even where this run counts it in
    another global batch), or None for a fresh start.
    """
    choice: list[str | None] = [None]
    if world.is_main:
        path = manager.find_resumable(length.epochs)
        choice[0] = str(path) if path else None
    if world.distributed:
        import torch.distributed as dist

        dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return None
    header = manager.load(Path(choice[0]), state)
    progress = state.progress
    checkpoint_step = progress.step
    steps_per_epoch = length.steps_per_epoch
    if progress.epoch_step:
        _carry_epoch_step_over(header, manager.identity, progress, steps_per_epoch)
    _carry_run_step_over(progress, length)
    log.info(
        "resumed from checkpoint %s in restart attempt %d: epoch %d of %d, step %d "
        "(%d of %d steps of epoch %d done)",
        choice[0],
        restart_attempt,
        progress.last_step_epoch,
        length.epochs,
        checkpoint_step,
        progress.epoch_step or steps_per_epoch,
        steps_per_epoch,
        progress.last_step_epoch,
    )
    return {"attempt": restart_attempt, "epoch": progress.last_step_epoch, "step": checkpoint_step}


def _carry_epoch_step_over(
    header: dict[str, Any], identity: dict[str, Any], progress: TrainState, steps_per_epoch: int
) -> None:
    """Move `progress` to the step of this run's epoch that has seen as many images as the checkpoint's,
    warning when the world size changed the count (never past the epoch's end)."""
    step = checkpoints.equivalent_epoch_step(header, identity, progress.epoch_step)
    if step == progress.epoch_step:
        return
    log.warning(
        "the checkpoint was written by %s processes (global batch %s), this run has %d (%d): "
        "epoch %d continues at step %d of %d, the nearest to the %d steps done before",
        header.get("world_size"),
        header.get("global_batch", "unknown"),
        identity["world_size"],
        identity["global_batch"],
        progress.last_step_epoch,
        min(step, steps_per_epoch),
        steps_per_epoch,
        progress.epoch_step,
    )
    progress.epoch_step = min(step, steps_per_epoch)


def _carry_run_step_over(progress: TrainState, length: optim.RunLength) -> None:
    """Count the run's steps in this run's global batch: the completed epochs' steps plus the (carried over)
    position in the next one.

    The learning-rate schedule and lookahead's averaging are functions of the step against this run's
    `total_steps`; a step count taken in another global batch would end the schedule early (after a larger
    global batch: the remaining steps at learning rate 0) or never (after a smaller one: no final averaging,
    so the saved model is not the average). With the same global batch the count is unchanged."""
    step = progress.epoch * length.steps_per_epoch + progress.epoch_step
    if step == progress.step:
        return
    log.warning(
        "the checkpoint's %d steps were taken in another global batch: this run counts them as %d of its %d, "
        "so that the learning-rate schedule and lookahead's final averaging end with its last step",
        progress.step,
        step,
        length.total_steps,
    )
    progress.step = step


def resume_record(progress: TrainState, epochs: int, resumed_from: dict[str, int]) -> dict[str, Any]:
    """The progress record a resumed attempt publishes before training: the last completed epoch's figures."""
    last = progress.history[-1] if progress.history else {}
    return progress_record(
        progress.epoch,
        epochs,
        progress.step,
        loss=last.get("train_loss"),
        accuracy=last.get("val_accuracy"),
        validation_loss=last.get("val_loss"),
        images_per_second=last.get("images_per_second"),
        resumed_from=resumed_from,
    )
