"""A checkpoint writer that SIGKILLs itself at one named step of the write sequence, for
test_checkpoint_recovery.

It runs the trainer's own code (`CheckpointManager`: the start-up clean-up, the resume choice and the
adoption of an older attempt's checkpoint, then one save with its digest and pruning) and kills itself,
as the kernel would kill a pod's process, at the step named on the command line. The steps are found by
wrapping the calls the write sequence makes (`torch.save`, `Path.replace`, `Path.unlink`, `os.link`), so
the code under test carries no test hook; a step the sequence never reaches leaves the process alive to
exit 0, which the test reports as a step that no longer exists.

Usage: checkpoint_kill_worker.py JOB_DIR ATTEMPT {resume,save} STEP
`resume` arms the trap before the resume (an older attempt's checkpoint is adopted then), `save` before
the save that follows it.
"""

from __future__ import annotations

import io
import os
import pathlib
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from kubetrain_trainer.components.checkpointing import CheckpointManager, run_identity
from kubetrain_trainer.components.training_state import CheckpointedState, TrainState
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv

CONFIG = TrainerConfig(epochs=3, checkpoint_every_steps=4, checkpoint_every_seconds=0, keep_checkpoints=1)

SAVE_STEPS = (
    "temp-created",  # mkstemp made the empty temporary file, nothing written yet
    "temp-half-written",  # torch.save wrote half the checkpoint into it
    "before-checkpoint-rename",  # written and fsynced, not yet renamed to its name
    "after-checkpoint-rename",  # the checkpoint has its name, its digest is not written yet
    "before-digest-rename",  # the digest is in its temporary file
    "after-digest-rename",  # committed; the older checkpoints not pruned yet
    "pruning",  # pruning deleted the older checkpoint's digest, not yet the checkpoint
)
"""The steps of a save at which the writer can die, in the order it reaches them."""

ADOPT_STEPS = (
    "before-link",  # the temporary name for the link is made and freed
    "after-link",  # the temporary name is a hard link to the older attempt's checkpoint
    "after-checkpoint-rename",  # the adopted name exists, its digest does not
    "before-digest-rename",
    "after-digest-rename",
)
"""The steps of an adoption (an older attempt's checkpoint made the resuming attempt's own)."""


def manager(job_dir: Path, attempt: int) -> CheckpointManager:
    """The checkpoint manager of restart attempt `attempt` of one job, keeping a single checkpoint."""
    identity = run_identity(CONFIG, WorldEnv(), "uid-1", ["cat", "dog"], global_batch=8)
    return CheckpointManager.for_run(
        CONFIG, WorldEnv(), torch.device("cpu"), job_dir, identity, restart_attempt=attempt
    )


def state(step: int) -> CheckpointedState:
    """A run's state after `step` steps in the middle of epoch 1, its weights all equal to `step`."""
    model = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(model.weight, float(step))
    return CheckpointedState(
        model, torch.optim.SGD(model.parameters(), lr=0.1), None, TrainState(step=step, epoch_step=step)
    )


def resume(job_dir: Path, attempt: int) -> tuple[CheckpointManager, Path | None, int]:
    """What a restarted run does first: the manager, the checkpoint it resumes (None: fresh) and its step."""
    chosen = manager(job_dir, attempt)
    path = chosen.find_resumable(CONFIG.epochs)
    if path is None:
        return chosen, None, 0
    restored = state(0)
    chosen.load(path, restored)
    return chosen, path, restored.progress.step


def _arm(step: str) -> None:
    """SIGKILL this process when the write sequence reaches `step`."""

    def reached(name: str) -> None:
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)

    real_save, real_link = torch.save, os.link
    real_replace, real_unlink = pathlib.Path.replace, pathlib.Path.unlink

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        reached("temp-created")
        if step == "temp-half-written":
            buffer = io.BytesIO()
            real_save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            Path(f).write_bytes(data[: len(data) // 2])
            reached("temp-half-written")
        real_save(obj, f, *args, **kwargs)

    def replace(self: pathlib.Path, target: Any) -> pathlib.Path:
        kind = "digest" if str(target).endswith(".sha256") else "checkpoint"
        reached(f"before-{kind}-rename")
        result = real_replace(self, target)
        reached(f"after-{kind}-rename")
        return result

    def unlink(self: pathlib.Path, missing_ok: bool = False) -> None:
        real_unlink(self, missing_ok=missing_ok)
        if self.name.endswith(".pt.sha256"):  # pruning deletes a checkpoint's digest before the checkpoint
            reached("pruning")

    def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        reached("before-link")
        real_link(src, dst, *args, **kwargs)
        reached("after-link")

    torch.save = save  # type: ignore[assignment]
    pathlib.Path.replace = replace  # type: ignore[method-assign]
    pathlib.Path.unlink = unlink  # type: ignore[method-assign]
    os.link = link


def main() -> None:
    job_dir, attempt, phase, step = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if phase == "resume":
        _arm(step)
    chosen, _, resumed_step = resume(job_dir, attempt)
    if phase == "save":
        _arm(step)
    chosen.save(state(resumed_step + 4))
    chosen.wait()


if __name__ == "__main__":
    main()
