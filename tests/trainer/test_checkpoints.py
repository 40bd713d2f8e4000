"""Checkpoints are atomic, sorted by (attempt, epoch, step), pruned to the newest K, written from a copy of
the state in the background, and a corrupt newest one falls back to the previous."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from kubetrain_trainer import snapshots
from kubetrain_trainer.checkpoints import Checkpointer

pytestmark = pytest.mark.unit


def _model(value: float) -> torch.nn.Linear:
    model = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(model.weight, value)
    return model


def _save(ckpt: Checkpointer, epoch: int, step: int | None = None) -> Path:
    step = epoch * 10 if step is None else step
    return ckpt.save(epoch, step, {"model": _model(float(step))}, {"note": f"step {step}"})


def test_round_trip_restores_weights_and_header(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=3)
    path = _save(ckpt, 4, 37)
    assert path.name == "attempt-0000-epoch-000004-step-0000000037.pt"
    restored = torch.nn.Linear(2, 2)
    header = ckpt.load(path, {"model": restored})
    assert header == {"epoch": 4, "step": 37, "attempt": 0, "note": "step 37"}
    assert torch.all(restored.weight == 37.0)


def test_names_sort_by_epoch_then_step_and_an_old_epoch_name_sorts_as_that_epochs_end(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=10)
    _save(ckpt, 2, 15)
    _save(ckpt, 1, 9)
    _save(ckpt, 2, 110)  # more steps than digits of the smaller one: compared as numbers
    torch.save({"epoch": 1}, tmp_path / "epoch-000001.pt")  # what older trainers wrote
    names = [path.name for _, path in ckpt.candidates()]
    assert names == [
        "attempt-0000-epoch-000002-step-0000000110.pt",
        "attempt-0000-epoch-000002-step-0000000015.pt",
        "epoch-000001.pt",
        "attempt-0000-epoch-000001-step-0000000009.pt",
    ]


def test_only_the_newest_k_are_kept(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=2)
    for step in (5, 10, 15):
        _save(ckpt, 1, step)
    assert [key for key, _ in ckpt.candidates()] == [(0, 1, 15), (0, 1, 10)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "attempt-0000-epoch-000001-step-0000000010.pt",
        "attempt-0000-epoch-000001-step-0000000010.pt.sha256",
        "attempt-0000-epoch-000001-step-0000000015.pt",
        "attempt-0000-epoch-000001-step-0000000015.pt.sha256",
    ]


def test_a_background_save_writes_the_state_as_it_was_when_called(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=2)
    model = _model(1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    model.weight.grad = torch.ones_like(model.weight)
    model.bias.grad = torch.ones_like(model.bias)
    optimizer.step()  # weights 0.5, momentum buffers 1
    path = ckpt.save_in_background(1, 1, {"model": model, "optimizer": optimizer}, {})
    # The loop goes on while the writer thread works: none of this may reach the file.
    optimizer.step()
    optimizer.param_groups[0]["lr"] = 0.1
    ckpt.wait()

    restored = _model(0.0)
    restored_opt = torch.optim.SGD(restored.parameters(), lr=0.0, momentum=0.9)
    ckpt.load(path, {"model": restored, "optimizer": restored_opt})
    assert torch.all(restored.weight == 0.5)
    assert restored_opt.param_groups[0]["lr"] == 0.5
    assert torch.all(restored_opt.state[restored.weight]["momentum_buffer"] == 1.0)
    assert ckpt.is_valid(path)


def test_a_snapshot_shares_no_tensor_or_container_with_the_live_state() -> None:
    live = {"weights": torch.ones(3), "groups": [{"lr": 0.5, "params": [0]}], "pair": (torch.zeros(1), 2)}
    copy = snapshots.cpu_copy(live)
    live["weights"].add_(1)
    live["groups"][0]["lr"] = 0.1
    live["groups"][0]["params"].append(1)
    live["pair"][0].add_(1)
    assert torch.equal(copy["weights"], torch.ones(3))
    assert copy["groups"] == [{"lr": 0.5, "params": [0]}]
    assert torch.equal(copy["pair"][0], torch.zeros(1)) and copy["pair"][1] == 2


def test_a_failed_background_write_is_raised_by_the_next_save(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the checkpoint directory should be")
    ckpt = Checkpointer(blocker, keep=2)
    ckpt.save_in_background(1, 1, {"model": _model(1.0)}, {})
    with pytest.raises(OSError):
        ckpt.save_in_background(1, 2, {"model": _model(2.0)}, {})


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "missing_digest"])
def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = Checkpointer(tmp_path, keep=3)
    older = _save(ckpt, 1)
    newest = _save(ckpt, 2)
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip_byte":
        newest.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        newest.with_name(newest.name + ".sha256").unlink()
    with caplog.at_level(logging.WARNING):
        assert ckpt.newest_valid() == older
    assert newest.name in caplog.text and "corrupt" in caplog.text


def test_no_checkpoint_directory_means_a_fresh_start(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path / "absent", keep=2).newest_valid() is None
