"""What the trainer writes is readable by other pods that mount the volume under other uids (the helper
pod of `kubetrain artifacts`, a serving pod): files 0644 and the directories it makes 0755, whatever the
writer's umask, and the writes stay atomic."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubetrain_trainer import atomic

pytestmark = pytest.mark.unit


@pytest.fixture
def strict_umask() -> Iterator[None]:
    """A umask that lets no one else read (mkstemp's 0600 and mkdir's 0777 would both come out 0600/0700)."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("strict_umask")
def test_files_are_0644_and_the_directories_made_for_them_0755(tmp_path: Path) -> None:
    job = tmp_path / "output" / "cifar"
    atomic.write_text_atomic(job / "metrics.json", "{}\n")
    atomic.write_atomic(job / "checkpoints" / "a.pt", lambda tmp: tmp.write_bytes(b"x"))
    atomic.write_atomic(job / "model.pt", lambda tmp: shutil.copyfile(job / "checkpoints" / "a.pt", tmp))
    assert {str(p.relative_to(tmp_path)): oct(_mode(p)) for p in sorted(tmp_path.rglob("*"))} == {
        "output": "0o755",
        "output/cifar": "0o755",
        "output/cifar/checkpoints": "0o755",
        "output/cifar/checkpoints/a.pt": "0o644",
        "output/cifar/metrics.json": "0o644",
        "output/cifar/model.pt": "0o644",
    }


@pytest.mark.usefixtures("strict_umask")
def test_a_directory_that_exists_is_left_as_it_is(tmp_path: Path) -> None:
    mine = tmp_path / "output"
    mine.mkdir(mode=0o700)
    atomic.write_text_atomic(mine / "progress.json", "{}\n")
    assert _mode(mine) == 0o700 and _mode(mine / "progress.json") == 0o644


def test_a_replaced_file_keeps_the_mode_and_no_temporary_file_is_left(tmp_path: Path) -> None:
    target = tmp_path / "progress.json"
    atomic.write_text_atomic(target, "1\n")
    target.chmod(0o600)
    atomic.write_text_atomic(target, "2\n")
    assert target.read_text() == "2\n" and _mode(target) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]


def test_the_rename_is_synced_to_disk_after_the_files_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync of the file, then of its directory once the new name is in it: the order a crash-safe
    rename needs (data first, then the entry that names it)."""
    synced: list[tuple[str, bool]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        target = Path(f"/proc/self/fd/{fd}").readlink()
        synced.append((target.name if target.is_dir() else "file", (tmp_path / "job" / "model.pt").exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    atomic.write_atomic(tmp_path / "job" / "model.pt", lambda tmp: tmp.write_bytes(b"weights"))
    assert synced == [("file", False), ("job", True)]
