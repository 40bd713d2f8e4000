"""Atomic file writes: a reader (another rank, the operator, a restarted pod) never sees half a file.

What is written is readable by everyone (files 0644, directories 0755, whatever the umask): other pods
mounting the volume under other uids read the artifacts, such as `kubetrain artifacts`' helper pod or a
serving pod. Only the writer's uid may change them.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

FILE_MODE = 0o644
DIRECTORY_MODE = 0o755


def make_directory(directory: Path) -> None:
    """`mkdir -p` with DIRECTORY_MODE for each directory it creates (mkdir's mode is cut by the umask;
    directories that exist are left as they are: they may not be ours)."""
    if directory.is_dir():
        return
    make_directory(directory.parent)
    try:
        directory.mkdir()
    except FileExistsError:  # another rank was first
        return
    directory.chmod(DIRECTORY_MODE)


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp)` on a temporary file in `path`'s directory, fsync it, rename it to `path`, and
    fsync the directory.

    The temporary file lives in the same directory so the rename is atomic on one filesystem; it is
    removed when `write` fails so a crash leaves no stray partial file that looks like a result. The file
    gets FILE_MODE before the rename (mkstemp makes it 0600).
    """
    make_directory(path.parent)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        with tmp.open("rb+") as handle:
            os.fsync(handle.fileno())
        if tmp.stat().st_mode & 0o777 != FILE_MODE:  # a hard link to a file of ours may have it already
            tmp.chmod(FILE_MODE)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """Make the rename durable: until its directory is synced, a node that loses power may come back with
    the old name or none, though the file's data was synced (a checkpoint the run counted on, gone).
    Filesystems that cannot sync a directory (some network ones refuse with EINVAL) are left as they are."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Atomically replace `path` with `text` (UTF-8)."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
