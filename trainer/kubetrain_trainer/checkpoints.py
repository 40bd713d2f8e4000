"""Checkpoints of the training state: rank 0 writes atomically, every rank loads, corrupt ones are skipped.

A checkpoint `attempt-AAAA-epoch-EEEEEE-step-SSSSSSSSSS.pt` holds the state after S optimizer steps of the
run, the last of them in epoch E (1-based), written by restart attempt A (`KUBETRAIN_RESTART_ATTEMPT`, 0
when unset). Names sort by (attempt, epoch, step), as numbers, and an epoch's end is its largest step.
Older trainers wrote `epoch-EEEEEE-step-SSSSSSSSSS.pt` and, before mid-epoch checkpoints, `epoch-EEEEEE.pt`
at the end of epoch E; those still load, as attempt 0's, the second as its epoch's end.

Attempts are fenced: after a whole-group restart, a pod of the old attempt on a node cut off from the API
server may keep training and writing into the same directory. So
- resume takes the newest valid checkpoint of the newest attempt (`newest_first`): once the live attempt
  has written one, an older attempt's later steps are a dead lineage and never win;
- an attempt that resumes from an older attempt's checkpoint first makes it its own
  (`Checkpointer.adopt`: a hard link, or a copy, under its attempt's name), so the live lineage holds
  the state it resumed from at once, and an old writer learns of the new attempt at its next save;
- pruning, and the clean-up at start, delete only the writer's own attempt's and older attempts' files
  (`prunable`, `Checkpointer.clean_up`): a newer attempt's writer may be between its two renames;
- a writer that finds a checkpoint of a newer attempt of its job (`Checkpointer.superseded_by`: a
  directory listing, and a header read only when a newer name is there) is a leftover: it raises
  `failures.SupersededError` (exit 130, INTERRUPTED) instead of writing or pruning again.

Writing does not stall training: `save_in_background` copies the state to CPU memory on the caller's thread
(`snapshots.cpu_copy`), then one writer thread serialises it to a temporary file, fsyncs and renames it,
and writes its SHA-256 atomically to `<name>.sha256`. At most one write is in flight: the next save, and
`wait`, first finish the previous one and re-raise its error; when training fails or is interrupted
(SIGTERM), the interpreter joins the writer thread before the process exits, so the write in flight is
finished rather than torn.

The digest is the commit record. A checkpoint without one was never committed (its writer was killed
between the two renames) and is discarded, never recovered: `Checkpointer.clean_up` deletes it at the
next start with the temporary files a kill leaves, since nothing tells a complete file from one cut
short except the digest it never got. A checkpoint whose digest does not match (the volume was
truncated, a bit flipped) is invalid too. Resume takes the newest valid one and says which it passed
over; pruning counts only valid ones towards `keep` and deletes the rest of its own and older attempts',
and deletes a checkpoint's digest before the checkpoint, so a kill at any step of a save leaves the
previous valid checkpoint in place until the new one is committed.

A checkpoint also records who wrote it: the restart attempt, the TrainingJob's uid, the class names and
the config fields that shape the state (`config.resume_identity`). The output directory is keyed by the
job's name, which a new TrainingJob may reuse; `resume_mismatch` says why such a checkpoint must not be
resumed, and another job's checkpoints never fence this one's writer.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch

from kubetrain_trainer import atomic, snapshots
from kubetrain_trainer.failures import SupersededError

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(?:attempt-(\d{4,})-)?epoch-(\d{6})(?:-step-(\d{10}))?\.pt$")
_TEMPORARY = re.compile(r"^\.(.+)\.[a-z0-9_]+\.tmp$")
"""`atomic.write_atomic`'s temporary file for the name in the group: `.NAME.XXXXXXXX.tmp` (mkstemp)."""
_END_OF_EPOCH = 1 << 62
"""Sort key step of an old `epoch-EEEEEE.pt`: it was written at the end of its epoch."""


class CheckpointKey(NamedTuple):
    """What a checkpoint's name says, in the order resume prefers: newest attempt, then epoch, then step."""

    attempt: int
    epoch: int
    step: int
    """`_END_OF_EPOCH` for an old `epoch-EEEEEE.pt`."""


def parse_name(name: str) -> CheckpointKey | None:
    """The key of a checkpoint file's name; None for anything else (digests, temporary files)."""
    match = _NAME.match(name)
    if match is None:
        return None
    attempt, epoch, step = match.groups()
    return CheckpointKey(int(attempt or 0), int(epoch), int(step) if step else _END_OF_EPOCH)


def checkpoint_name(attempt: int, epoch: int, step: int) -> str:
    """The file name of attempt `attempt`'s checkpoint after `step` steps, the last in `epoch`."""
    if step == _END_OF_EPOCH:  # an adopted old `epoch-EEEEEE.pt` keeps saying it ends its epoch
        return f"attempt-{attempt:04d}-epoch-{epoch:06d}.pt"
    return f"attempt-{attempt:04d}-epoch-{epoch:06d}-step-{step:010d}.pt"


def newest_first(names: Iterable[str]) -> list[tuple[CheckpointKey, str]]:
    """The checkpoint names among `names` with their keys, the one resume prefers first.

    The attempt leads: a restarted attempt resumes from the newest checkpoint of the attempts before it, and
    once it has written (or adopted) one, an older attempt's later steps, written by a writer left running,
    are a lineage nobody continues.
    """
    found = [(key, name) for name in names if (key := parse_name(name)) is not None]
    return sorted(found, reverse=True)


def prunable(names: Iterable[str], attempt: int, keep: int, valid: Callable[[str], bool]) -> list[str]:
    """The checkpoints attempt `attempt`'s writer deletes to keep its `keep` newest valid ones: its own and
    older attempts' only, never a newer attempt's, whose writer owns the directory now.

    An invalid checkpoint (`valid(name)` false: no digest, or one that does not match) takes no place and
    is deleted: counted, a broken file that sorts newest would make every new checkpoint delete itself and
    the valid one before it. `valid` is asked only until `keep` valid ones are found; what sorts after
    them goes either way.
    """
    kept = 0
    doomed = []
    for key, name in newest_first(names):
        if key.attempt > attempt:
            continue
        if kept < keep and valid(name):
            kept += 1
        else:
            doomed.append(name)
    return doomed


def leftover_attempt(name: str) -> int | None:
    """The attempt whose write left `name` behind if it is a checkpoint's or digest's temporary file, a
    digest's or a checkpoint's name; None for anything else."""
    temporary = _TEMPORARY.match(name)
    if temporary is not None:
        name = temporary.group(1)
    key = parse_name(name.removesuffix(".sha256"))
    return key.attempt if key is not None else None


def newer_attempts(names: Iterable[str], attempt: int) -> list[str]:
    """The checkpoints among `names` written by attempts after `attempt`, newest first."""
    return [name for key, name in newest_first(names) if key.attempt > attempt]


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
    """Saves and restores a dict of `Stateful` components under one directory, as restart attempt
    `attempt` of the TrainingJob `job_uid`."""

    def __init__(self, directory: Path, keep: int, attempt: int = 0, job_uid: str = "") -> None:
        self.directory = directory
        self.keep = keep
        self.attempt = attempt
        self.job_uid = job_uid
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending: Future[None] | None = None
        self._checked: dict[str, tuple[int, int, int, str]] = {}
        """Pruning's memory of the checkpoints it found valid, by name: (inode, size, mtime, digest), so
        each is hashed once per process, not at every save."""

    def path_for(self, epoch: int, step: int) -> Path:
        """Where this attempt's checkpoint after `step` optimizer steps, the last in `epoch` (1-based), is."""
        return self.directory / checkpoint_name(self.attempt, epoch, step)

    def _names(self) -> list[str]:
        return [path.name for path in self.directory.iterdir()] if self.directory.is_dir() else []

    def candidates(self) -> list[tuple[CheckpointKey, Path]]:
        """(key, path) of every checkpoint file present, the one resume prefers first, valid or not."""
        return [(key, self.directory / name) for key, name in newest_first(self._names())]

    def superseded_by(self) -> Path | None:
        """The newest checkpoint a newer restart attempt of this job wrote here, if any: then this process
        belongs to an attempt the operator has replaced and must stop writing.

        A directory listing; a newer name's header is read only to tell this job's from another's (a
        TrainingJob re-created under the same name starts at attempt 0). A file that cannot be read (torn,
        or pruned meanwhile by its writer) is no evidence.
        """
        for name in newer_attempts(self._names(), self.attempt):
            path = self.directory / name
            try:
                header = self.read_header(path)
            except Exception:  # torch.load's error for a torn file depends on where it was cut
                continue
            if header.get("job_uid", "") == self.job_uid:
                return path
        return None

    def ensure_current(self) -> None:
        """Raise `SupersededError` if a newer restart attempt of this job has written a checkpoint here."""
        newer = self.superseded_by()
        if newer is None:
            return
        key = parse_name(newer.name)
        assert key is not None  # newer_attempts lists checkpoint names only
        raise SupersededError(
            f"checkpoint {newer.name} in {self.directory} was written by restart attempt {key.attempt} of "
            f"this job and this process is attempt {self.attempt}: a newer attempt has taken over (this one "
            "was left running, e.g. on a node cut off from the API server), so this process stops without "
            "writing or deleting another checkpoint"
        )

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
        if any, surfaces here rather than being lost. Raises `SupersededError`, writing nothing, when a
        newer attempt of this job has written a checkpoint here.
        """
        self.wait()
        self.ensure_current()
        blob = {
            "epoch": epoch,
            "step": step,
            "attempt": self.attempt,
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
        try:
            atomic.write_atomic(path, lambda tmp: torch.save(blob, tmp))
            digest = _sha256(path)
            atomic.write_text_atomic(_digest_path(path), digest + "\n")
            stat = path.stat()
        except OSError:
            # A newer attempt's `clean_up` removes an older attempt's temporary files: this process was
            # replaced, which is what it must report, not the missing file.
            self.ensure_current()
            raise
        self._checked[path.name] = (stat.st_ino, stat.st_size, stat.st_mtime_ns, digest)
        self.ensure_current()  # a newer attempt may have started while this one was writing: delete nothing
        for name in prunable(self._names(), self.attempt, self.keep, self._valid_for_pruning):
            old = self.directory / name
            _digest_path(old).unlink(missing_ok=True)  # the commit record first: a kill here leaves no
            old.unlink(missing_ok=True)  # file that looks committed and is not
            self._checked.pop(name, None)

    def _valid_for_pruning(self, name: str) -> bool:
        """`is_valid`, remembered: a checkpoint is replaced under its name, never changed in place."""
        path = self.directory / name
        try:
            stat = path.stat()
            digest = _digest_path(path).read_text(encoding="utf-8").strip()
        except OSError:
            return False
        seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns, digest)
        if self._checked.get(name) == seen:
            return True
        if self._invalid(path) is not None:
            return False
        self._checked[name] = seen
        return True

    def clean_up(self) -> list[str]:
        """Delete what writes killed midway left here, of this attempt and older ones; the names deleted.

        That is temporary files (`.NAME.XXXXXXXX.tmp`), checkpoints without a digest (never committed: see
        the module's docstring) and digests without a checkpoint. Called at start, before this process
        writes anything, so none of its own writes is in flight. A newer attempt's files are never touched:
        its writer may be live, between its two renames. An older attempt's writer left running may lose
        the write it has in flight, which costs the live attempt nothing: that writer learns at its next
        save that it was replaced (`_write`).
        """
        names = set(self._names())
        removed = []
        for name in sorted(names):
            attempt = leftover_attempt(name)
            if attempt is None or attempt > self.attempt:
                continue
            orphan_digest = name.endswith(".sha256") and name.removesuffix(".sha256") not in names
            uncommitted = parse_name(name) is not None and f"{name}.sha256" not in names
            if _TEMPORARY.match(name) or orphan_digest or uncommitted:
                (self.directory / name).unlink(missing_ok=True)
                removed.append(name)
        if removed:
            log.warning(
                "removed %d files that writes killed midway left in %s (a checkpoint without its digest was "
                "never committed, and is never resumed): %s",
                len(removed),
                self.directory,
                ", ".join(removed),
            )
        return removed

    def adopt(self, path: Path) -> Path:
        """Make `path`, the checkpoint this attempt resumes from, this attempt's own; the path to load.

        An older attempt's checkpoint gets a second name under this attempt (a hard link: no copy, and a
        later change to either name cannot touch the other; a copy where the volume has no hard links),
        with its digest. From then on the live lineage holds the state it resumed from whatever an old
        writer left running prunes, that writer finds the new attempt at its next save, and a later restart
        resumes this attempt's lineage, never the old writer's later steps. This attempt's own checkpoint
        is returned as it is.
        """
        key = parse_name(path.name)
        if key is None or key.attempt >= self.attempt:
            return path
        target = self.directory / checkpoint_name(self.attempt, key.epoch, key.step)
        digest = _digest_path(path).read_text(encoding="utf-8")
        how = "linked"
        try:
            atomic.write_atomic(target, lambda tmp: _replace_with_link(path, tmp))
        except OSError:  # no hard links on this volume (some FUSE and object-store mounts)
            how = "copied"
            atomic.write_atomic(target, lambda tmp: shutil.copyfile(path, tmp))
        atomic.write_text_atomic(_digest_path(target), digest)
        log.info(
            "restart attempt %d resumes from attempt %d's checkpoint %s, %s as its own %s",
            self.attempt,
            key.attempt,
            path.name,
            how,
            target.name,
        )
        return target

    def is_valid(self, path: Path) -> bool:
        """Whether `path` has a digest file that matches its content."""
        return self._invalid(path) is None

    def _invalid(self, path: Path) -> str | None:
        """What is wrong with `path` as a checkpoint, or None when its digest matches its content."""
        try:
            expected = _digest_path(path).read_text(encoding="utf-8").strip()
        except OSError:
            return "incomplete or corrupt (it has no digest)"
        try:
            actual = _sha256(path)
        except OSError as error:  # deleted meanwhile by its writer's pruning, or unreadable
            return f"unreadable ({error.strerror})"
        return None if expected == actual else "corrupt (its digest does not match)"

    def newest_valid(self) -> Path | None:
        """The newest checkpoint whose digest matches; each invalid newer one is reported as a warning that
        names the one used instead, or says that none is left."""
        passed_over: list[tuple[CheckpointKey, Path, str]] = []
        for key, path in self.candidates():
            why = self._invalid(path)
            if why is None:
                for old_key, old, old_why in passed_over:
                    log.warning(
                        "checkpoint %s (epoch %d) is %s; the newest valid one is %s",
                        old,
                        old_key.epoch,
                        old_why,
                        path.name,
                    )
                return path
            passed_over.append((key, path, why))
        for old_key, old, old_why in passed_over:
            log.warning(
                "checkpoint %s (epoch %d) is %s, and no valid checkpoint is left to resume",
                old,
                old_key.epoch,
                old_why,
            )
        return None

    def read_header(self, path: Path) -> dict[str, Any]:
        """The checkpoint's epoch, step, attempt and extra fields, without restoring anything."""
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


def _replace_with_link(source: Path, tmp: Path) -> None:
    """Make `tmp` (an empty temporary file) a hard link to `source`."""
    tmp.unlink()
    os.link(source, tmp)


def _header(blob: Mapping[str, Any]) -> dict[str, Any]:
    """`{"epoch", "step", "attempt", **extra}`: `step` is None in checkpoints older than mid-epoch ones,
    `attempt` (the attempt that wrote it; an adopted checkpoint keeps its writer's) 0 in those older than
    attempt fencing."""
    step = blob.get("step")
    extra = dict(blob.get("extra", {}))
    return {**extra, "epoch": int(blob["epoch"]), "step": step, "attempt": int(blob.get("attempt", 0))}


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
