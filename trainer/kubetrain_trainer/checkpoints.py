"""Checkpoints of the training state: rank 0 writes atomically, every rank loads, corrupt ones are skipped.

A checkpoint `epoch-EEEEEE-step-SSSSSSSSSS.pt` holds the state after S optimizer steps of the run, the last
of them in epoch E (1-based), so names sort by (epoch, step) and an epoch's end is its largest step.
Older trainers wrote `epoch-EEEEEE.pt` at the end of epoch E; those still load and sort as that epoch's end.

Writing does not stall training: `save_in_background` copies the state to CPU memory on the caller's thread
(`snapshots.cpu_copy`), then one writer thread serialises it to a temporary file, fsyncs and renames it,
and writes its SHA-256 atomically to `<name>.sha256`. At most one write is in flight: the next save, and
`wait`, first finish the previous one and re-raise its error; when training fails or is interrupted
(SIGTERM), the interpreter joins the writer thread before the process exits, so the write in flight is
finished rather than torn. A checkpoint without a matching digest (the
pod died between the two renames, the volume was truncated, a bit flipped) is invalid: resume warns and
uses the previous one.

A checkpoint also records who wrote it: the TrainingJob's uid, the class names and the config fields that
shape the state (`config.resume_identity`). The output directory is keyed by the job's name, which a new
TrainingJob may reuse; `resume_mismatch` says why such a checkpoint must not be resumed.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import torch

from kubetrain_trainer import atomic, snapshots

log = logging.getLogger(__name__)

_NAME = re.compile(r"^epoch-(\d{6})(?:-step-(\d{10}))?\.pt$")
_END_OF_EPOCH = 1 << 62
"""Sort key step of an old `epoch-EEEEEE.pt`: it was written at the end of its epoch."""


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


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


class Checkpointer:
    """Saves and restores a dict of `Stateful` components under one directory."""

    def __init__(self, directory: Path, keep: int) -> None:
        self.directory = directory
        self.keep = keep
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending: Future[None] | None = None

    def path_for(self, epoch: int, step: int) -> Path:
        """Where the checkpoint after `step` optimizer steps, the last in `epoch` (1-based), lives."""
        return self.directory / f"epoch-{epoch:06d}-step-{step:010d}.pt"

    def candidates(self) -> list[tuple[tuple[int, int], Path]]:
        """((epoch, step), path) of every checkpoint file present, newest first, valid or not."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match:
                step = int(match.group(2)) if match.group(2) else _END_OF_EPOCH
                found.append(((int(match.group(1)), step), path))
        return sorted(found, reverse=True)

    def save(self, epoch: int, step: int, components: dict[str, Stateful], extra: dict[str, Any]) -> Path:
        """Write the checkpoint and wait until it and its digest are on disk."""
        path = self.save_in_background(epoch, step, components, extra)
        self.wait()
        return path

    def save_in_background(
        self, epoch: int, step: int, components: dict[str, Stateful], extra: dict[str, Any]
    ) -> Path:
        """Copy the state now, write it (digest, pruning to the `keep` newest) on the writer thread.

        Returns the path the checkpoint will have; the previous write is finished first, so its error,
        if any, surfaces here rather than being lost.
        """
        self.wait()
        blob = {
            "epoch": epoch,
            "step": step,
            "extra": extra,
            **{name: snapshots.cpu_copy(c.state_dict()) for name, c in components.items()},
        }
        path = self.path_for(epoch, step)
        self._pending = self._writer.submit(self._write, path, blob)
        return path

    def wait(self) -> None:
        """Block until the write in flight, if any, is done; re-raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _write(self, path: Path, blob: dict[str, Any]) -> None:
        atomic.write_atomic(path, lambda tmp: torch.save(blob, tmp))
        atomic.write_text_atomic(_digest_path(path), _sha256(path) + "\n")
        for _, old in self.candidates()[self.keep :]:
            _digest_path(old).unlink(missing_ok=True)
            old.unlink(missing_ok=True)

    def is_valid(self, path: Path) -> bool:
        """Whether `path` has a digest file that matches its content."""
        try:
            expected = _digest_path(path).read_text(encoding="utf-8").strip()
        except OSError:
            return False
        return expected == _sha256(path)

    def newest_valid(self) -> Path | None:
        """The newest checkpoint whose digest matches; each invalid newer one is reported as a warning."""
        for (epoch, _), path in self.candidates():
            if self.is_valid(path):
                return path
            log.warning(
                "checkpoint %s (epoch %d) is corrupt or incomplete; falling back to an older one", path, epoch
            )
        return None

    def read_header(self, path: Path) -> dict[str, Any]:
        """The checkpoint's epoch, step and extra fields, without restoring anything."""
        blob = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return _header(blob)

    def discard(self) -> list[Path]:
        """Delete every checkpoint (and digest) here: they belong to another job or config."""
        removed = []
        for _, path in self.candidates():
            _digest_path(path).unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            removed.append(path)
        return removed

    def load(self, path: Path, components: dict[str, Stateful]) -> dict[str, Any]:
        """Restore `components` from `path` (weights_only: checkpoints are data, never code); its header."""
        blob = torch.load(path, map_location="cpu", weights_only=True)
        for name, component in components.items():
            component.load_state_dict(blob[name])
        return _header(blob)


def _header(blob: Mapping[str, Any]) -> dict[str, Any]:
    """`{"epoch", "step", **extra}`; `step` is None in checkpoints older than mid-epoch ones."""
    step = blob.get("step")
    return {**dict(blob.get("extra", {})), "epoch": int(blob["epoch"]), "step": step}


def equivalent_epoch_step(saved: Mapping[str, Any], current: Mapping[str, Any], epoch_step: int) -> int:
    """The step of this run that has seen as much of the interrupted epoch as `epoch_step` steps of the
    run that wrote the checkpoint.

    Global batches are contiguous slices of the epoch's permutation (`batches`), so with the same global
    batch step k covers the same images at any world size: an elastic group that changed size resumes
    exactly. A different global batch (an elastic group whose size does not divide its batch evenly, or an
    older checkpoint from another world size) continues at the step nearest the images already seen: at
    most half a batch of the epoch is seen twice or skipped, and nothing already learnt is thrown away.
    """
    old = saved.get("global_batch")
    new = current.get("global_batch")
    if old is None or new is None:  # older checkpoints: the same per-rank batch, another world size
        old, new = saved.get("world_size") or 1, current["world_size"]
    if old == new:
        return epoch_step
    return max(1, round(epoch_step * int(old) / int(new)))


def resume_mismatch(saved: Mapping[str, Any], current: Mapping[str, Any], epochs: int) -> str | None:
    """Why the checkpoint described by `saved` (its header) must not resume `current`, or None.

    Both hold `job_uid`, `classes`, `config` (a `config.resume_identity`), `world_size` and `global_batch`
    (absent in older checkpoints); `saved` also its `epoch`. Another world size is no reason: the state
    means the same, and a mid-epoch position is carried over (`equivalent_epoch_step`).
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
