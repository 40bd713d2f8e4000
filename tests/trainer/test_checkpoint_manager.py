"""The checkpoint manager saves the run's state with who wrote it, finds the checkpoint this run may resume,
deletes another job's, and records a partial epoch's totals with a mid-epoch checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from kubetrain_trainer.components.checkpointing import CheckpointManager, config_field_names, run_identity
from kubetrain_trainer.components.training_state import CheckpointedState, TrainState
from kubetrain_trainer.config import RESUME_NEUTRAL_FIELDS, TrainerConfig, resume_identity
from kubetrain_trainer.distributed import WorldEnv

pytestmark = pytest.mark.unit

CONFIG = TrainerConfig(epochs=3, checkpoint_every_steps=4, checkpoint_every_seconds=0)


def _manager(job_dir: Path, job_uid: str = "uid-1") -> CheckpointManager:
    identity = run_identity(CONFIG, WorldEnv(), job_uid, ["cat", "dog"], global_batch=8)
    return CheckpointManager.for_run(CONFIG, WorldEnv(), torch.device("cpu"), job_dir, identity)


def _state(weight: float, **progress: int) -> CheckpointedState:
    model = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(model.weight, weight)
    return CheckpointedState(model, torch.optim.SGD(model.parameters(), lr=0.1), None, TrainState(**progress))


def test_a_checkpoint_of_this_job_resumes_with_its_state_and_who_wrote_it(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    manager.save(_state(0.5, epoch=1, step=10, epoch_step=2))
    manager.wait()
    path = manager.find_resumable(CONFIG.epochs)
    assert path is not None and path.name == "attempt-0000-epoch-000002-step-0000000010.pt"
    restored = _state(0.0)
    header = manager.load(path, restored)
    assert torch.all(restored.model.weight == 0.5)
    assert (restored.progress.epoch, restored.progress.step, restored.progress.epoch_step) == (1, 10, 2)
    assert header["job_uid"] == "uid-1" and header["global_batch"] == 8 and header["epoch_step"] == 2


def test_another_jobs_checkpoints_are_deleted_and_the_run_starts_fresh(tmp_path: Path) -> None:
    previous = _manager(tmp_path, job_uid="old-uid")
    previous.save(_state(0.5, epoch=1, step=8))
    previous.wait()
    manager = _manager(tmp_path, job_uid="new-uid")
    assert manager.find_resumable(CONFIG.epochs) is None
    assert manager.checkpointer.candidates() == []


def test_a_mid_epoch_save_records_the_partial_epoch_totals(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    state = _state(0.5, step=4, epoch_step=4)
    manager.save_mid_epoch(torch.tensor([6.0, 20.0, 32.0], dtype=torch.float64), state)
    manager.wait()
    assert state.progress.epoch_totals == [6.0, 20.0, 32.0]
    restored = _state(0.0)
    manager.load(manager.checkpointer.path_for(1, 4), restored)
    assert restored.progress.epoch_totals == [6.0, 20.0, 32.0]


def test_checkpoints_are_due_every_configured_number_of_steps(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    assert [step for step in range(1, 10) if manager.due(step)] == [4, 8]


def _older_shape(
    manager: CheckpointManager, *, lacks: tuple[str, ...] = (), had: dict[str, Any] | None = None
) -> None:
    """Make `manager` write checkpoints as an older trainer did: its config identity without the fields
    `lacks` (added since) and with `had` (fields that have since become free to change, or been removed)."""
    config = manager.identity["config"]
    for key in lacks:
        del config[key]
    config.update(had or {})


def test_a_checkpoint_written_before_config_fields_existed_is_resumed_not_deleted(tmp_path: Path) -> None:
    """Issue 26, defect 7: an upgrade that adds config fields (here `flip` and `crop_padding`, which older
    trainers lacked and ran as their defaults do) or makes one free to change (`precision`) keeps the
    checkpoints."""
    older = _manager(tmp_path)
    _older_shape(older, lacks=("flip", "crop_padding"), had={"precision": "fp32"})
    older.save(_state(0.5, epoch=1, step=10))
    older.wait()
    manager = _manager(tmp_path)
    path = manager.find_resumable(CONFIG.epochs)
    assert path is not None and path.name == "attempt-0000-epoch-000001-step-0000000010.pt"
    assert [p.name for _, p in manager.checkpointer.candidates()] == [path.name]


def test_a_checkpoint_with_a_config_field_since_removed_is_resumed_not_deleted(tmp_path: Path) -> None:
    """The reverse upgrade: a field older trainers recorded (here a made-up `data.legacy_shards`) that this
    config no longer has cannot tell the runs apart."""
    older = _manager(tmp_path)
    _older_shape(older, had={"data.legacy_shards": 8})
    older.save(_state(0.5, epoch=1, step=10))
    older.wait()
    path = _manager(tmp_path).find_resumable(CONFIG.epochs)
    assert path is not None and path.name == "attempt-0000-epoch-000001-step-0000000010.pt"


def test_the_config_shape_names_every_identity_field_and_nothing_else() -> None:
    full = TrainerConfig()
    assert set(resume_identity(full)) == config_field_names() - RESUME_NEUTRAL_FIELDS


def test_a_new_field_set_to_other_than_its_default_still_starts_fresh(tmp_path: Path) -> None:
    older = _manager(tmp_path)
    _older_shape(older, lacks=("flip",))
    older.save(_state(0.5, epoch=1, step=10))
    older.wait()
    config = CONFIG.model_copy(update={"flip": "alternating"})
    identity = run_identity(config, WorldEnv(), "uid-1", ["cat", "dog"], global_batch=8)
    manager = CheckpointManager.for_run(config, WorldEnv(), torch.device("cpu"), tmp_path, identity)
    assert manager.find_resumable(CONFIG.epochs) is None
    assert manager.checkpointer.candidates() == []


def test_a_chosen_checkpoint_pruned_before_it_is_adopted_gives_way_to_the_next_valid_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older attempt's writer left running prunes its own checkpoints: the newest one may vanish between
    rank 0 choosing it and linking it as this attempt's own. The next valid checkpoint is resumed instead
    of the run failing (a counted restart) on a missing file."""
    old_writer = _manager(tmp_path)
    for step in (10, 20):
        old_writer.save(_state(0.5, epoch=1, step=step))
        old_writer.wait()
    identity = run_identity(CONFIG, WorldEnv(), "uid-1", ["cat", "dog"], global_batch=8)
    manager = CheckpointManager.for_run(
        CONFIG, WorldEnv(), torch.device("cpu"), tmp_path, identity, restart_attempt=1
    )
    read_header = manager.checkpointer.read_header

    def read_then_pruned(path: Path) -> dict[str, Any]:
        header = read_header(path)
        if path.name.endswith("step-0000000020.pt"):
            path.unlink()  # the old writer's prune, landing right after the choice
        return header

    monkeypatch.setattr(manager.checkpointer, "read_header", read_then_pruned)
    path = manager.find_resumable(CONFIG.epochs)
    assert path is not None and path.name == "attempt-0001-epoch-000001-step-0000000010.pt"
