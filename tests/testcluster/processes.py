"""Starting and stopping the control plane's processes so that none outlives its cluster."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL the child when the test process dies, even by SIGKILL."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    """A port that was free a moment ago; the kernel hands out ephemeral ports round-robin, so a
    concurrent run on the same machine is unlikely to get the same one before we bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(name: str, argv: Sequence[str], log_dir: Path, *, detached: bool) -> subprocess.Popen[bytes]:
    """Start one component in its own process group, logging to `<log_dir>/<name>.log`.

    A detached component (the developer cluster) must survive the command that started it; otherwise the
    component is tied to this process's life.
    """
    log = (log_dir / f"{name}.log").open("ab")
    try:
        return subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=None if detached else die_with_parent,  # noqa: PLW1509 - only calls prctl
        )
    finally:
        log.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pid: int, grace_seconds: float = 5.0) -> None:
    """SIGTERM the process group led by `pid`, then SIGKILL what is left after the grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline:
            _reap(pid)
            if not pid_alive(pid):
                return
            time.sleep(0.05)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def kill_until_gone(find: Callable[[], Collection[int]], *, rounds: int = 3, pause: float = 0.3) -> None:
    """SIGKILL every pid `find()` names, again until it names none (processes that are not our children,
    such as containerd's shims and the containers they start, found through a namespace or a cgroup)."""
    for _ in range(rounds):
        pids = find()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(pause)
