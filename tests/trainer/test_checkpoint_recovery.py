"""Checkpoints never lose a run: a writer killed at any step of a write leaves a directory the next run
resumes from its newest valid checkpoint, broken files never take one of the `keep_checkpoints` places,
leftovers of a kill are cleaned at start, and a newer attempt's files are never touched."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from checkpoint_kill_worker import ADOPT_STEPS, SAVE_STEPS, resume, state
from kubetrain_trainer import checkpoints
from kubetrain_trainer.checkpoints import Checkpointer
from kubetrain_trainer.failures import SupersededError
from trainer_helpers import save_step_checkpoint

pytestmark = pytest.mark.unit

WORKER = Path(__file__).with_name("checkpoint_kill_worker.py")
A0_S8 = "attempt-0000-epoch-000001-step-0000000008.pt"
A0_S12 = "attempt-0000-epoch-000001-step-0000000012.pt"
A0_S20 = "attempt-0000-epoch-000002-step-0000000020.pt"
A1_S4 = "attempt-0001-epoch-000001-step-0000000004.pt"
A1_S10 = "attempt-0001-epoch-000001-step-0000000010.pt"
A2_S16 = "attempt-0002-epoch-000002-step-0000000016.pt"


def _digest(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize(
    ("names", "broken", "writer", "keep", "deleted"),
    [
        # A broken newest one takes no place: the writer keeps its valid newest and deletes the broken one.
        ([A0_S8, A0_S12, A0_S20], {A0_S20}, 0, 1, [A0_S20, A0_S8]),
        ([A0_S8, A0_S12, A0_S20], {A0_S20}, 0, 2, [A0_S20]),
        ([A0_S8, A0_S12, A0_S20], {A0_S12}, 0, 2, [A0_S12]),
        # An older attempt's broken file is deleted by the live writer as its own are...
        ([A0_S20, A1_S4, A1_S10], {A0_S20}, 1, 3, [A0_S20]),
        # ...but a newer attempt's never, broken or not: its writer may be between its two renames.
        ([A0_S8, A0_S20, A1_S4], {A1_S4, A0_S20}, 0, 1, [A0_S20]),
    ],
    ids=["broken-newest", "broken-newest-keep-2", "broken-between", "older-attempts", "never-newer"],
)
def test_pruning_counts_only_valid_checkpoints_and_deletes_broken_ones(
    names: list[str], broken: set[str], writer: int, keep: int, deleted: list[str]
) -> None:
    assert checkpoints.prunable(names, writer, keep, valid=lambda name: name not in broken) == deleted


def test_with_keep_1_a_new_checkpoint_survives_a_broken_newer_one(tmp_path: Path) -> None:
    """Issue 26, defect 1: the run killed after a checkpoint's rename and before its digest restarts in the
    same attempt (a local run, torchrun's restart) and resumes the checkpoint before it; its next one
    must not be pruned for the broken one, which sorts newer."""
    first = Checkpointer(tmp_path, keep=1)
    save_step_checkpoint(first, 1, 8)
    # What a kill between the two renames leaves: the next checkpoint without its digest, before pruning.
    broken = save_step_checkpoint(Checkpointer(tmp_path, keep=2), 2, 20)
    _digest(broken).unlink()
    restarted = Checkpointer(tmp_path, keep=1)
    resumed = restarted.newest_valid()
    assert resumed is not None and resumed.name == A0_S8
    new = save_step_checkpoint(restarted, 1, 12)
    assert Checkpointer(tmp_path, keep=1).newest_valid() == new
    assert _files(tmp_path) == [A0_S12, A0_S12 + ".sha256"]


def test_the_resume_warning_names_the_fallback_or_says_there_is_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = Checkpointer(tmp_path, keep=3)
    older, newest = save_step_checkpoint(writer, 1, 8), save_step_checkpoint(writer, 2, 20)
    _digest(newest).unlink()
    with caplog.at_level(logging.WARNING):
        assert writer.newest_valid() == older
    assert (
        f"checkpoint {newest} (epoch 2) is incomplete or corrupt (it has no digest); the newest valid one is {A0_S8}"
        in caplog.text
    )
    caplog.clear()
    _digest(older).write_text("0" * 64 + "\n")
    with caplog.at_level(logging.WARNING):
        assert writer.newest_valid() is None
    assert "falling back" not in caplog.text and "the newest valid one" not in caplog.text
    assert (
        f"checkpoint {older} (epoch 1) is corrupt (its digest does not match), and no valid checkpoint is left to resume"
        in caplog.text
    )


def test_start_removes_this_and_older_attempts_leftovers_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What kills leave: temporary files, a checkpoint without its digest, a digest without its checkpoint.
    Those of this attempt and older ones go; a newer attempt's (whose writer may be live) and anything
    that is not a checkpoint's stay."""
    writer = Checkpointer(tmp_path, keep=3, attempt=1)
    valid = save_step_checkpoint(writer, 1, 10)
    leftovers = [
        f".{A0_S8}.k2j3h4g5.tmp",  # a write killed before its rename
        f".{A1_S4}.sha256.a_b1c2d3.tmp",  # a digest killed before its rename
        ".epoch-000003.pt.zzzzzzzz.tmp",  # an older trainer's name: attempt 0
        A0_S12,  # renamed, digest never written
        A0_S20 + ".sha256",  # its checkpoint gone
    ]
    kept = [
        f".{A2_S16}.q1w2e3r4.tmp",  # a newer attempt's write in flight
        A2_S16,  # a newer attempt between its two renames (torn: no evidence of a newer attempt)
        ".progress.json.abcdefgh.tmp",
        "notes.txt",
    ]
    for name in leftovers + kept:
        (tmp_path / name).write_bytes(b"torn")
    with caplog.at_level(logging.WARNING):
        assert writer.clean_up() == sorted(leftovers)
    assert f"removed 5 files that writes killed midway left in {tmp_path}" in caplog.text
    assert "resume uses" not in caplog.text  # it promises no checkpoint, which there may not be
    assert _files(tmp_path) == sorted([valid.name, valid.name + ".sha256", *kept])


def test_an_old_attempts_writer_never_deletes_a_newer_attempts_files_in_flight(tmp_path: Path) -> None:
    """A writer left running from attempt 0 saves and prunes while attempt 1 is in the middle of its first
    write (its temporary file, then its checkpoint without a digest, torn so it is no evidence yet)."""
    old = Checkpointer(tmp_path, keep=1, attempt=0)
    save_step_checkpoint(old, 1, 8)
    in_flight = [f".{A1_S10}.a1b2c3d4.tmp", A1_S10]
    for name in in_flight:
        (tmp_path / name).write_bytes(b"torn")
    save_step_checkpoint(old, 1, 12)
    old.clean_up()
    assert _files(tmp_path) == sorted([A0_S12, A0_S12 + ".sha256", *in_flight])


def _kill_at(job_dir: Path, attempt: int, phase: str, step: str) -> None:
    result = subprocess.run(
        [sys.executable, str(WORKER), str(job_dir), str(attempt), phase, step],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL, f"never reached step {step}: {result.stderr}"


def _then_the_next_run_resumes(job_dir: Path, attempt: int, resumed_step: int) -> None:
    """The next run resumes `resumed_step`, its own next checkpoint is the one the run after it resumes,
    and (keep 1) it is all that is left: nothing a kill left behind survives."""
    manager, path, step = resume(job_dir, attempt)
    assert path is not None and step == resumed_step
    manager.save(state(step + 2))
    manager.wait()
    assert resume(job_dir, attempt)[2] == step + 2
    new = checkpoints.checkpoint_name(attempt, 1, step + 2)
    assert _files(job_dir / "checkpoints") == [new, new + ".sha256"]


@pytest.mark.parametrize("step", SAVE_STEPS)
def test_a_writer_killed_at_any_step_of_a_save_loses_at_most_that_checkpoint(
    tmp_path: Path, step: str
) -> None:
    """keep_checkpoints 1: attempt 0 has its checkpoint after 8 steps and is SIGKILLed while writing the
    one after 12; restarted (the same attempt, as a local run or torchrun's restart is), it resumes 12
    once that is committed (its digest renamed into place), else 8, and its next checkpoint survives."""
    manager, _, _ = resume(tmp_path, 0)
    manager.save(state(8))
    manager.wait()
    _kill_at(tmp_path, 0, "save", step)
    assert Checkpointer(tmp_path / "checkpoints", keep=1).newest_valid() is not None
    committed = SAVE_STEPS.index(step) >= SAVE_STEPS.index("after-digest-rename")
    _then_the_next_run_resumes(tmp_path, 0, 12 if committed else 8)


@pytest.mark.parametrize("step", ADOPT_STEPS)
def test_a_writer_killed_at_any_step_of_an_adoption_resumes_the_same_state(tmp_path: Path, step: str) -> None:
    """Attempt 1 is SIGKILLed while making attempt 0's checkpoint its own; attempt 2 resumes that state."""
    manager, _, _ = resume(tmp_path, 0)
    manager.save(state(8))
    manager.wait()
    _kill_at(tmp_path, 1, "resume", step)
    _then_the_next_run_resumes(tmp_path, 2, 8)


def test_an_old_writer_whose_write_a_newer_attempt_cleaned_up_stops_as_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 1 starts, writes and cleans up while attempt 0's writer, left running, is in the middle of a
    write: the temporary file it is writing goes, and it reports that it was replaced (exit 130), not
    the missing file (exit 1)."""
    old = Checkpointer(tmp_path, keep=1, attempt=0)
    live = Checkpointer(tmp_path, keep=1, attempt=1)
    real_save = torch.save

    def save_while_attempt_1_starts(obj: object, f: Path) -> None:
        real_save(obj, f)
        monkeypatch.setattr(torch, "save", real_save)
        save_step_checkpoint(live, 1, 4)
        assert live.clean_up() == [f.name]

    monkeypatch.setattr(torch, "save", save_while_attempt_1_starts)
    with pytest.raises(SupersededError, match="a newer attempt has taken over"):
        save_step_checkpoint(old, 1, 8)
    assert _files(tmp_path) == [A1_S4, A1_S4 + ".sha256"]


def test_pruning_hashes_each_checkpoint_once_not_at_every_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting only valid checkpoints must not re-read the kept ones at every save (large models)."""
    hashed = []
    real_sha256 = checkpoints._sha256

    def counting_sha256(path: Path) -> str:
        hashed.append(path.name)
        return real_sha256(path)

    monkeypatch.setattr(checkpoints, "_sha256", counting_sha256)
    writer = Checkpointer(tmp_path, keep=3)
    for step in range(1, 6):
        save_step_checkpoint(writer, 1, step)
    assert hashed == [checkpoints.checkpoint_name(0, 1, step) for step in range(1, 6)]
