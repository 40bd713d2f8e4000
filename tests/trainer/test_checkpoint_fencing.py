"""Checkpoints are fenced by restart attempt: a writer left running from a replaced attempt (a pod on a node
cut off from the API server) never deletes or replaces the live attempt's checkpoints, stops at its next
save with exit 130, and a later resume continues the live attempt's lineage, never the old writer's."""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from kubetrain_trainer import checkpoints
from kubetrain_trainer.checkpoints import Checkpointer
from kubetrain_trainer.components.checkpointing import CheckpointManager, run_identity
from kubetrain_trainer.components.training_state import CheckpointedState, TrainState
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.exit_codes import ExitCode
from kubetrain_trainer.failures import SupersededError
from trainer_helpers import (
    constant_linear,
    kubetrain,
    save_step_checkpoint,
    start_ranks,
    trainer_env,
    wait_all,
)

A0_E1_S8 = "attempt-0000-epoch-000001-step-0000000008.pt"
A0_E2_S20 = "attempt-0000-epoch-000002-step-0000000020.pt"
A1_E1_S6 = "attempt-0001-epoch-000001-step-0000000006.pt"
A1_E1_S10 = "attempt-0001-epoch-000001-step-0000000010.pt"
A2_E1_S4 = "attempt-0002-epoch-000001-step-0000000004.pt"
OLD_E3_S30 = "epoch-000003-step-0000000030.pt"  # written before attempts were in the name: attempt 0
OLD_E3 = "epoch-000003.pt"  # before mid-epoch checkpoints: the end of epoch 3, attempt 0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("names", "newest_first"),
    [
        # A replaced attempt's writer went on to later steps: the live attempt's lineage still comes first.
        ([A0_E2_S20, A1_E1_S6, A1_E1_S10], [A1_E1_S10, A1_E1_S6, A0_E2_S20]),
        ([OLD_E3_S30, A1_E1_S6], [A1_E1_S6, OLD_E3_S30]),
        ([OLD_E3_S30, OLD_E3, A0_E2_S20], [OLD_E3, OLD_E3_S30, A0_E2_S20]),
        # Attempts compare as numbers, past the four digits of the name.
        (
            ["attempt-9999-epoch-000009-step-0000000090.pt", "attempt-10000-epoch-000001-step-0000000001.pt"],
            ["attempt-10000-epoch-000001-step-0000000001.pt", "attempt-9999-epoch-000009-step-0000000090.pt"],
        ),
        # Digests, temporary files and anything else are not checkpoints.
        ([A0_E1_S8 + ".sha256", f".{A0_E1_S8}.abc.tmp", "progress.json", A0_E1_S8], [A0_E1_S8]),
    ],
    ids=[
        "live-lineage-beats-later-step",
        "old-name-is-attempt-0",
        "old-names-by-epoch-then-step",
        "attempts-as-numbers",
        "only-checkpoints",
    ],
)
def test_resume_prefers_the_newest_attempt_then_epoch_then_step(
    names: list[str], newest_first: list[str]
) -> None:
    assert [name for _, name in checkpoints.newest_first(names)] == newest_first


@pytest.mark.unit
@pytest.mark.parametrize(
    ("names", "writer", "keep", "deleted"),
    [
        # The replaced writer never deletes the live attempt's files, only its own beyond its keep count.
        ([A0_E1_S8, A0_E2_S20, A1_E1_S6, A1_E1_S10], 0, 1, [A0_E1_S8]),
        ([A0_E2_S20, A1_E1_S6, A1_E1_S10], 0, 1, []),
        # The live writer keeps its newest, then older attempts' while it has fewer than `keep` of its own.
        ([A0_E1_S8, A0_E2_S20, A1_E1_S6], 1, 2, [A0_E1_S8]),
        ([A0_E1_S8, A0_E2_S20, A1_E1_S6, A1_E1_S10], 1, 2, [A0_E2_S20, A0_E1_S8]),
        ([OLD_E3_S30, A1_E1_S6], 1, 1, [OLD_E3_S30]),
        # Even a writer that has not seen the newer attempt yet leaves its files alone.
        ([A1_E1_S6, A2_E1_S4], 1, 1, []),
    ],
    ids=[
        "old-writer-own-only",
        "old-writer-nothing-else",
        "live-keeps-resumed-from",
        "live-own-newest",
        "old-name",
        "never-newer",
    ],
)
def test_pruning_deletes_only_the_writers_own_and_older_attempts(
    names: list[str], writer: int, keep: int, deleted: list[str]
) -> None:
    assert checkpoints.prunable(names, writer, keep, valid=lambda _: True) == deleted


@pytest.mark.unit
@pytest.mark.parametrize(
    ("attempt", "newer"),
    [(0, [A2_E1_S4, A1_E1_S10]), (1, [A2_E1_S4]), (2, []), (5, [])],
)
def test_a_newer_attempt_is_told_by_the_names_alone(attempt: int, newer: list[str]) -> None:
    names = [OLD_E3_S30, A0_E1_S8, A1_E1_S10, A2_E1_S4, A2_E1_S4 + ".sha256"]
    assert checkpoints.newer_attempts(names, attempt) == newer


def _digests(directory: Path, prefix: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.glob(f"{prefix}*.pt.sha256"))}


@pytest.mark.unit
def test_two_writers_in_one_directory_the_old_one_stops_and_the_live_lineage_resumes(tmp_path: Path) -> None:
    old = Checkpointer(tmp_path, keep=2, attempt=0)
    save_step_checkpoint(old, 1, 2)
    save_step_checkpoint(old, 1, 4)
    live = Checkpointer(tmp_path, keep=3, attempt=1)  # its two and the old writer's newest
    resumed_from = live.newest_valid()
    assert resumed_from is not None and resumed_from.name == "attempt-0000-epoch-000001-step-0000000004.pt"
    # The old writer saves once more before the live attempt has made its choice its own...
    save_step_checkpoint(old, 1, 6)
    adopted = live.adopt(resumed_from)
    assert adopted.name == "attempt-0001-epoch-000001-step-0000000004.pt" and live.is_valid(adopted)
    assert adopted.samefile(resumed_from)  # a hard link (tmp_path's volume has them): no copy
    # ...and is stopped at its next one, which writes nothing.
    with pytest.raises(SupersededError) as stopped:
        save_step_checkpoint(old, 2, 8)
    assert str(stopped.value).startswith(
        f"checkpoint {adopted.name} in {tmp_path} was written by restart attempt 1 of this job and this "
        "process is attempt 0: a newer attempt has taken over"
    )
    assert stopped.value.exit_code == ExitCode.INTERRUPTED
    assert not (tmp_path / "attempt-0000-epoch-000002-step-0000000008.pt").exists()
    save_step_checkpoint(live, 1, 5)
    live_files = _digests(tmp_path, "attempt-0001-")
    assert list(live_files) == [
        adopted.name + ".sha256",
        "attempt-0001-epoch-000001-step-0000000005.pt.sha256",
    ]

    # The live attempt crashes; the next one resumes its lineage, not the old writer's later step 6.
    after = Checkpointer(tmp_path, keep=2, attempt=2)
    assert (tmp_path / "attempt-0000-epoch-000001-step-0000000006.pt").exists()
    newest = after.newest_valid()
    assert newest is not None and newest.name == "attempt-0001-epoch-000001-step-0000000005.pt"
    restored = torch.nn.Linear(2, 2)
    assert after.load(newest, {"model": restored})["attempt"] == 1
    assert torch.all(restored.weight == 5.0)
    assert _digests(tmp_path, "attempt-0001-") == live_files


@pytest.mark.unit
def test_an_adopted_old_epoch_only_checkpoint_still_ends_its_epoch(tmp_path: Path) -> None:
    old = tmp_path / OLD_E3
    torch.save({"epoch": 3, "model": constant_linear(3.0).state_dict()}, old)
    old.with_name(old.name + ".sha256").write_text(checkpoints._sha256(old) + "\n")
    adopted = Checkpointer(tmp_path, keep=2, attempt=4).adopt(old)
    assert adopted.name == "attempt-0004-epoch-000003.pt"
    key = checkpoints.parse_name(OLD_E3)
    assert key is not None and checkpoints.parse_name(adopted.name) == key._replace(attempt=4)
    assert Checkpointer(tmp_path, keep=2, attempt=4).newest_valid() == adopted


@pytest.mark.unit
def test_where_the_volume_has_no_hard_links_the_adopted_checkpoint_is_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = save_step_checkpoint(Checkpointer(tmp_path, keep=2, attempt=0), 1, 4)

    def no_links(*_: object) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")  # link(2) on such a volume

    monkeypatch.setattr(os, "link", no_links)
    adopted = Checkpointer(tmp_path, keep=2, attempt=1).adopt(source)
    assert adopted.name == "attempt-0001-epoch-000001-step-0000000004.pt"
    assert not adopted.samefile(source) and adopted.read_bytes() == source.read_bytes()
    assert Checkpointer(tmp_path, keep=2, attempt=1).is_valid(adopted)
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # no temporary file left behind
        source.name,
        source.name + ".sha256",
        adopted.name,
        adopted.name + ".sha256",
    ]


CONFIG = TrainerConfig(epochs=3, checkpoint_every_steps=4, checkpoint_every_seconds=0, keep_checkpoints=1)


def _manager(
    job_dir: Path, attempt: int, job_uid: str = "uid-1", config: TrainerConfig = CONFIG
) -> CheckpointManager:
    identity = run_identity(config, WorldEnv(), job_uid, ["cat", "dog"], global_batch=8)
    return CheckpointManager.for_run(
        config, WorldEnv(), torch.device("cpu"), job_dir, identity, restart_attempt=attempt
    )


def _state(step: int) -> CheckpointedState:
    model = constant_linear(float(step))
    progress = TrainState(step=step, epoch_step=step)  # in the middle of epoch 1
    return CheckpointedState(model, torch.optim.SGD(model.parameters(), lr=0.1), None, progress)


@pytest.mark.unit
def test_a_replaced_attempt_neither_resumes_nor_deletes_the_newer_attempts_checkpoints(
    tmp_path: Path,
) -> None:
    newer = _manager(tmp_path, attempt=3)
    newer.save(_state(12))
    newer.wait()
    files = _digests(tmp_path / "checkpoints", "")
    # Its config differs too, which for an older attempt's checkpoint would mean deleting them all.
    replaced = _manager(tmp_path, attempt=2, config=CONFIG.model_copy(update={"seed": 9}))
    with pytest.raises(
        SupersededError, match="written by restart attempt 3 of this job and this process is attempt 2"
    ):
        replaced.find_resumable(CONFIG.epochs)
    assert _digests(tmp_path / "checkpoints", "") == files
    # A replaced attempt that reaches the end stops before writing its model and metrics.
    with pytest.raises(SupersededError):
        replaced.wait()


@pytest.mark.unit
def test_a_newer_attempt_of_another_job_under_the_same_name_does_not_fence_a_new_job(tmp_path: Path) -> None:
    deleted_job = _manager(tmp_path, attempt=5, job_uid="old-uid")
    deleted_job.save(_state(12))
    deleted_job.wait()
    new_job = _manager(tmp_path, attempt=0, job_uid="new-uid")
    assert new_job.find_resumable(CONFIG.epochs) is None  # another job's: deleted, as before attempts
    assert new_job.checkpointer.candidates() == []
    new_job.save(_state(4))
    new_job.wait()
    assert [path.name for _, path in new_job.checkpointer.candidates()] == [
        "attempt-0000-epoch-000001-step-0000000004.pt"
    ]


def _group_config(output: Path) -> dict[str, Any]:
    return {
        "model": "simple_cnn",
        "epochs": 4,
        "batch_size": 8,
        "seed": 5,
        "cpu_threads": 1,
        "output_dir": str(output),
        "checkpoint_every_steps": 2,
        "checkpoint_every_seconds": 0,
        "keep_checkpoints": 3,
        # The stopped group's collectives must outlast the time the new attempt runs.
        "collective_timeout_seconds": 600,
        # 128 training images / (2 ranks x 8): 8 steps an epoch, 32 in all.
        "data": {"dataset": "fake", "fake_size": 160, "validation_fraction": 0.2},
        "optimizer": {"lr": 0.05, "momentum": 0.9},
    }


@pytest.mark.distributed
@pytest.mark.trains
def test_a_group_left_running_from_attempt_0_stops_at_its_next_save_and_attempt_1s_checkpoints_survive(
    tmp_path: Path,
) -> None:
    config = _group_config(tmp_path)
    job_dir = tmp_path / "fenced"
    directory = job_dir / "checkpoints"
    command = ["-m", "kubetrain_trainer.cli", "train"]
    termination_log = tmp_path / "termination-log"
    old = start_ranks(
        command,
        config,
        world_size=2,
        job="fenced",
        KUBETRAIN_RESTART_ATTEMPT="0",
        KUBETRAIN_TERMINATION_LOG=str(termination_log),
    )
    try:
        deadline = time.monotonic() + 180
        while not list(directory.glob("attempt-0000-*.pt.sha256")):
            assert time.monotonic() < deadline, "no checkpoint appeared"
            assert all(p.poll() is None for p in old), "training ended before it could be left behind"
            time.sleep(0.005)
        # Attempt 0's group is cut off: frozen, as the operator starts attempt 1 beside it.
        for proc in old:
            proc.send_signal(signal.SIGSTOP)
        assert not (job_dir / "model.pt").exists(), "attempt 0 finished before it could be left behind"

        results = wait_all(
            start_ranks(command, config, world_size=2, job="fenced", KUBETRAIN_RESTART_ATTEMPT="1")
        )
        assert [code for code, _ in results] == [0, 0], results[0][1]
        assert "restart attempt 1 resumes from attempt 0's checkpoint attempt-0000-epoch-" in results[0][1]
        live_files = _digests(directory, "attempt-0001-")
        assert "attempt-0001-epoch-000004-step-0000000032.pt.sha256" in live_files
        model = (job_dir / "model.pt").read_bytes()

        # Attempt 0's group comes back and trains on, to its next save.
        for proc in old:
            proc.send_signal(signal.SIGCONT)
        (code0, out0), (code1, out1) = wait_all(old)
    finally:
        for proc in old:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stopped = "was written by restart attempt 1 of this job and this process is attempt 0: a newer attempt has taken over"
    assert (code0, code1) == (ExitCode.INTERRUPTED, ExitCode.INTERRUPTED), out0
    assert stopped in out0 and "exit code 130, INTERRUPTED" in out0
    assert stopped in out1  # the whole group stops together, not only rank 0
    record = json.loads(termination_log.read_text())
    assert record["exitCode"] == ExitCode.INTERRUPTED and stopped in record["message"]
    assert _digests(directory, "attempt-0001-") == live_files
    assert (job_dir / "model.pt").read_bytes() == model

    # A later attempt (one process now) resumes attempt 1's newest checkpoint, and trains one more epoch.
    env = trainer_env(config, KUBETRAIN_JOB_NAME="fenced", KUBETRAIN_RESTART_ATTEMPT="2")
    result = kubetrain("train", "--epochs", "5", env=env)
    assert result.returncode == 0, result.stderr
    assert (
        "restart attempt 2 resumes from attempt 1's checkpoint attempt-0001-epoch-000004-step-0000000032.pt"
    ) in result.stderr
    assert "in restart attempt 2: epoch 4 of 5, step 32 (" in result.stderr
    assert list(directory.glob("attempt-0002-epoch-000005-step-*.pt"))
