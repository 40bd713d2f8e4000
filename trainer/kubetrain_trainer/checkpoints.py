"""Checkpoints of the training state: rank 0 writes atomically, every rank loads, corrupt ones are skipped.

Each checkpoint `epoch-NNNNNN.pt` is written to a temporary file and renamed; its SHA-256 is then written
atomically to `epoch-NNNNNN.pt.sha256`. A checkpoint without a matching digest (the pod died between the
two renames, the volume was truncated, a bit flipped) is invalid: resume warns and uses the previous one.

A checkpoint also records who wrote it: the TrainingJob's uid, the class names and the config fields that
shape the state (`config.resume_identity`). The output directory is keyed by the job's name, which a new
TrainingJob may reuse; `resume_mismatch` says why such a checkpoint must not be resumed.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from kubetrain_trainer import atomic

log = logging.getLogger(__name__)

_NAME = re.compile(r"^epoch-(\d{6})\.pt$")


class Stateful(Protocol):
    """Anything whose state a checkpoint holds."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Checkpointer:
    """Saves and restores a dict of `Stateful` components under one directory."""

    def __init__(self, directory: Path, keep: int) -> None:
        self.directory = directory
        self.keep = keep

    def path_for(self, epoch: int) -> Path:
        """Where the checkpoint taken after `epoch` (1-based) lives."""
        return self.directory / f"epoch-{epoch:06d}.pt"

    def candidates(self) -> list[tuple[int, Path]]:
        """(epoch, path) of every checkpoint file present, newest first, valid or not."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found, reverse=True)

    def save(self, epoch: int, components: dict[str, Stateful], extra: dict[str, Any]) -> Path:
        """Write the checkpoint for `epoch` and its digest, then prune to the `keep` newest."""
        path = self.path_for(epoch)
        blob = {"epoch": epoch, "extra": extra, **{name: c.state_dict() for name, c in components.items()}}
        atomic.write_atomic(path, lambda tmp: torch.save(blob, tmp))
        atomic.write_text_atomic(path.with_name(path.name + ".sha256"), _sha256(path) + "\n")
        for _, old in self.candidates()[self.keep :]:
            old.with_name(old.name + ".sha256").unlink(missing_ok=True)
            old.unlink(missing_ok=True)
        return path

    def is_valid(self, path: Path) -> bool:
        """Whether `path` has a digest file that matches its content."""
        digest_path = path.with_name(path.name + ".sha256")
        try:
            expected = digest_path.read_text(encoding="utf-8").strip()
        except OSError:
            return False
        return expected == _sha256(path)

    def newest_valid(self) -> Path | None:
        """The newest checkpoint whose digest matches; each invalid newer one is reported as a warning."""
        for epoch, path in self.candidates():
            if self.is_valid(path):
                return path
            log.warning(
                "checkpoint %s (epoch %d) is corrupt or incomplete; falling back to an older one", path, epoch
            )
        return None

    def read_header(self, path: Path) -> dict[str, Any]:
        """The checkpoint's epoch and extra fields, without restoring anything."""
        blob = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return {**dict(blob.get("extra", {})), "epoch": int(blob["epoch"])}

    def discard(self) -> list[Path]:
        """Delete every checkpoint (and digest) here: they belong to another job or config."""
        removed = []
        for _, path in self.candidates():
            path.with_name(path.name + ".sha256").unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            removed.append(path)
        return removed

    def load(self, path: Path, components: dict[str, Stateful]) -> tuple[int, dict[str, Any]]:
        """Restore `components` from `path` (weights_only: checkpoints are data, never code)."""
        blob = torch.load(path, map_location="cpu", weights_only=True)
        for name, component in components.items():
            component.load_state_dict(blob[name])
        return int(blob["epoch"]), dict(blob.get("extra", {}))


def resume_mismatch(saved: Mapping[str, Any], current: Mapping[str, Any], epochs: int) -> str | None:
    """Why the checkpoint described by `saved` (its header) must not resume `current`, or None.

    Both hold `job_uid`, `classes` and `config` (a `config.resume_identity`); `saved` also its `epoch`.
    """
    if "job_uid" not in saved:
        return "it predates checkpoints that record their TrainingJob"
    if saved["job_uid"] != current["job_uid"]:
        old_uid, new_uid = saved["job_uid"] or "(none)", current["job_uid"] or "(none)"
        return f"it was written by TrainingJob uid {old_uid}, this is uid {new_uid}"
    if list(saved.get("classes") or ()) != list(current["classes"]):
        return (
            f"the dataset's classes differ ({len(saved.get('classes') or ())} -> {len(current['classes'])})"
        )
    old, new = dict(saved.get("config") or {}), current["config"]
    changed = [
        f"{key} {old.get(key)} -> {new.get(key)}"
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]
    if changed:
        return "the config changed: " + ", ".join(changed)
    if int(saved["epoch"]) > epochs:
        return f"checkpoint epoch {saved['epoch']} is past this run's epochs {epochs}"
    return None
