"""The run's checkpoints: which one it may resume, and writing them at epoch ends and mid-epoch when due.

Every rank calls `due` and the saves at the same steps, because both may hold collectives (the trigger's
clock flag, the partial epoch's totals, whether a newer attempt has taken over); only rank 0 writes. The
identity stored with every checkpoint decides whether a later process may resume from it
(`checkpoints.resume_mismatch`).

Each checkpoint is named for the restart attempt that wrote it, and a rank 0 that finds a newer attempt's
checkpoint of its job is a leftover of a replaced attempt (`checkpoints` says how attempts are fenced):
at a save or at the end of training the whole group learns it from rank 0 and raises
`failures.SupersededError` (exit 130) rather than train on beside the live attempt; at resume rank 0
raises it before anything is loaded, and the other ranks fail on the missing broadcast.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from kubetrain_trainer import checkpoints, heartbeat
from kubetrain_trainer import config as config_module
from kubetrain_trainer.checkpoint_trigger import CheckpointTrigger
from kubetrain_trainer.checkpoints import Checkpointer
from kubetrain_trainer.components.training_state import CheckpointedState
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv, all_reduce_sum
from kubetrain_trainer.failures import SupersededError

log = logging.getLogger(__name__)


CHOICE_ATTEMPTS = 5
"""How often rank 0 chooses again when the checkpoint it chose vanishes before it is adopted. Only an
older attempt's writer left running (a pod on a node cut off from the API server, force-deleted) prunes
here meanwhile, and it stops at its next save once this attempt's adopted checkpoint exists."""


def config_field_names(model: type[BaseModel] = TrainerConfig, prefix: str = "") -> frozenset[str]:
    """Every leaf field of the config shape, dotted as `config.resume_identity` names them, read from the
    models' declared fields (not from values, which could leave out a nested model that is unset)."""
    names: set[str] = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= config_field_names(annotation, f"{prefix}{name}.")
        else:
            names.add(f"{prefix}{name}")
    return frozenset(names)


def saved_identity(saved_config: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's `config` identity as this trainer's config shape reads it, to compare with the run's.

    A field the checkpoint lacks was added since it was written; the trainer that wrote it ran as the
    field's default does (that is what a new field's default must mean), so it counts as the default.
    A field that has since become free to change (`config.RESUME_NEUTRAL_FIELDS`), or that this trainer's
    config no longer has, is dropped: this trainer cannot run with it either way. Without this, an upgrade
    that adds or removes a field would find every checkpoint changed and delete them all.
    """
    defaults = config_module.resume_identity(TrainerConfig())
    known = config_field_names() - config_module.RESUME_NEUTRAL_FIELDS
    return {key: value for key, value in {**defaults, **saved_config}.items() if key in known}


def run_identity(
    config: TrainerConfig, world: WorldEnv, job_uid: str, classes: list[str], global_batch: int
) -> dict[str, Any]:
    """What a checkpoint must share with this run to be resumed (see `checkpoints.resume_mismatch`); the
    world size and global batch only say how to carry a mid-epoch position over."""
    return {
        "job_uid": job_uid,
        "classes": list(classes),
        "config": config_module.resume_identity(config),
        "world_size": world.world_size,
        "global_batch": global_batch,
    }


class CheckpointManager:
    """Rank 0's checkpoint directory and the trigger that says when to write between epoch ends."""

    def __init__(
        self,
        checkpointer: Checkpointer,
        trigger: CheckpointTrigger,
        identity: dict[str, Any],
        world: WorldEnv,
        tick: heartbeat.ProgressTick | None = None,
    ) -> None:
        self.checkpointer = checkpointer
        self.trigger = trigger
        self.identity = identity
        self.world = world
        self.tick = tick if tick is not None else heartbeat.ProgressTick()
        """Told when a checkpoint is written (the heartbeat's progress: a slow write is no hang)."""

    @classmethod
    def for_run(
        cls,
        config: TrainerConfig,
        world: WorldEnv,
        device: torch.device,
        job_dir: Path,
        identity: dict[str, Any],
        *,
        restart_attempt: int = 0,
        tick: heartbeat.ProgressTick | None = None,
    ) -> CheckpointManager:
        """The manager of the job's `checkpoints/` with the configured keep count and intervals, writing as
        restart attempt `restart_attempt` (`KUBETRAIN_RESTART_ATTEMPT`), telling `tick` of every checkpoint
        written."""
        trigger = CheckpointTrigger(
            every_steps=config.checkpoint_every_steps,
            every_seconds=config.checkpoint_every_seconds,
            distributed=world.distributed,
            device=device,
        )
        checkpointer = Checkpointer(
            job_dir / "checkpoints", config.keep_checkpoints, restart_attempt, identity["job_uid"]
        )
        return cls(checkpointer, trigger, identity, world, tick)

    def find_resumable(self, epochs: int) -> Path | None:
        """Rank 0's choice: the newest valid checkpoint if this job and config wrote it, else a fresh start.

        What writes killed midway left (temporary files, checkpoints without a digest) is deleted first
        (`Checkpointer.clean_up`). The directory is keyed by the job's name, which a new TrainingJob may
        reuse; another job's (or config's) checkpoints are deleted so that later restarts of this job never
        pick them up; the config is compared as this trainer reads it (`saved_identity`), so fields added
        since the checkpoint was written count as their defaults. An older attempt's checkpoint is first
        made this attempt's own (`Checkpointer.adopt`), and that is the path every rank loads. Raises
        `SupersededError` when a newer attempt of this job has written one: this process was replaced, and
        must neither resume nor delete anything.
        """
        self.checkpointer.ensure_current()
        self.checkpointer.clean_up()
        for attempt in range(1, CHOICE_ATTEMPTS + 1):
            path = self.checkpointer.newest_valid()
            if path is None:
                return None
            try:
                header = self.checkpointer.read_header(path)
                header["config"] = saved_identity(dict(header.get("config") or {}))
                why = checkpoints.resume_mismatch(header, self.identity, epochs)
                if why is None:
                    return self.checkpointer.adopt(path)
                break
            except FileNotFoundError:
                if attempt == CHOICE_ATTEMPTS:
                    raise
                log.warning(
                    "checkpoint %s was deleted while this attempt chose it (an older attempt's writer, still "
                    "running, pruned it): choosing again",
                    path,
                )
        removed = self.checkpointer.discard()
        log.warning(
            "not resuming from checkpoint %s: %s; starting fresh (removed %d old checkpoints)",
            path,
            why,
            len(removed),
        )
        return None

    def load(self, path: Path, state: CheckpointedState) -> dict[str, Any]:
        """Restore `state` from `path` on this rank; the checkpoint's header (epoch, step, who wrote it)."""
        return self.checkpointer.load(path, state.components())

    def start_clock(self) -> None:
        """Count the time interval from the start of training, not from set-up (decoding, resume)."""
        self.trigger.restart()

    def due(self, step: int) -> bool:
        """Whether to checkpoint after `step` optimizer steps (the same answer on every rank)."""
        return self.trigger.due(step)

    def save(self, state: CheckpointedState) -> None:
        """Every rank calls this at the same step; rank 0 copies the state and writes it in the background.

        Raises `SupersededError` on every rank, writing nothing, once a newer attempt has taken over.
        """
        self.trigger.restart()
        self._stop_if_superseded()
        self.tick()  # the previous checkpoint is on disk: rank 0 waited for it, the others for rank 0
        if not self.world.is_main:
            return
        progress = state.progress
        extra = {**self.identity, "epoch_step": progress.epoch_step}
        started = time.perf_counter()
        path = self.checkpointer.save_in_background(
            progress.last_step_epoch, progress.step, state.components(), extra
        )
        log.info(
            "checkpoint %s: training paused %.3fs to copy the state, writing it in the background",
            path.name,
            time.perf_counter() - started,
        )

    def save_mid_epoch(self, partial_totals: torch.Tensor, state: CheckpointedState) -> None:
        """Record the partial epoch's totals summed over all ranks, then save (collectives: every rank)."""
        state.progress.epoch_totals = all_reduce_sum(partial_totals, self.world).tolist()
        self.save(state)

    def wait(self) -> None:
        """Block until the checkpoint being written, if any, is on disk (before the final artifacts); every
        rank calls it, and all raise `SupersededError` if a newer attempt has taken over, so a replaced
        attempt that reaches the end never writes its model and metrics over the live attempt's."""
        self._stop_if_superseded()
        self.tick()

    def _stop_if_superseded(self) -> None:
        """Rank 0 finishes the write in flight and looks for a newer attempt's checkpoint; every rank raises
        `SupersededError` with its reason if it found one (a collective: every rank calls it)."""
        reason: list[str | None] = [None]
        if self.world.is_main:
            try:
                self.checkpointer.wait()
                self.checkpointer.ensure_current()
            except SupersededError as error:
                reason[0] = str(error)
        if self.world.distributed:
            import torch.distributed as dist

            dist.broadcast_object_list(reason, src=0)
        if reason[0] is not None:
            raise SupersededError(reason[0])
