"""Checkpoints are atomic, pruned to the newest K, and a corrupt newest one falls back to the previous."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from kubetrain_trainer.checkpoints import Checkpointer

pytestmark = pytest.mark.unit


def _save(ckpt: Checkpointer, epoch: int) -> Path:
    model = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(model.weight, float(epoch))
    return ckpt.save(epoch, {"model": model}, {"note": f"epoch {epoch}"})


def test_round_trip_restores_weights_and_extra(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=3)
    _save(ckpt, 4)
    restored = torch.nn.Linear(2, 2)
    epoch, extra = ckpt.load(ckpt.path_for(4), {"model": restored})
    assert epoch == 4 and extra == {"note": "epoch 4"}
    assert torch.all(restored.weight == 4.0)


def test_only_the_newest_k_are_kept(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=2)
    for epoch in (1, 2, 3):
        _save(ckpt, epoch)
    assert [e for e, _ in ckpt.candidates()] == [3, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "epoch-000002.pt",
        "epoch-000002.pt.sha256",
        "epoch-000003.pt",
        "epoch-000003.pt.sha256",
    ]


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "missing_digest"])
def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = Checkpointer(tmp_path, keep=3)
    _save(ckpt, 1)
    newest = _save(ckpt, 2)
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip_byte":
        newest.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        newest.with_name(newest.name + ".sha256").unlink()
    with caplog.at_level(logging.WARNING):
        assert ckpt.newest_valid() == ckpt.path_for(1)
    assert "epoch-000002.pt" in caplog.text and "corrupt" in caplog.text


def test_no_checkpoint_directory_means_a_fresh_start(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path / "absent", keep=2).newest_valid() is None
