"""The exit-code record in the container's termination message, so launchers cannot hide the real code.

`torchrun` exits 1 whenever a child fails, whatever the child's code; the operator decides between
restarting and failing from the code alone. So the code travels a second way: the trainer writes one JSON
line `{"exitCode": 3, "reason": "DATA_ERROR", "message": "..."}` to the file the kubelet reads into
`status.containerStatuses[].state.terminated.message` (the container's terminationMessagePath, named to the
trainer by `KUBETRAIN_TERMINATION_LOG`). The first process to fail writes it; processes stopped because of
that failure find the file taken and leave it alone, as torchrun itself reports the first failure as the
root cause. Any program may write the same line; for programs that write nothing, the reader also finds
the root cause's code in torchrun's own failure report, which the kubelet copies from the end of the log
(terminationMessagePolicy FallbackToLogsOnError).

Torch-free: the operator reads what the trainer writes with the same module.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import re
from pathlib import Path

MAX_MESSAGE_BYTES = 4096
"""The kubelet keeps at most this much of a termination message file."""

_TORCHRUN_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?^\s*exitcode\s*:\s*(-?\d+)", re.DOTALL | re.MULTILINE
)


@dataclasses.dataclass(frozen=True)
class ExitRecord:
    """The code a training process ended with and why, as recorded beside (or instead of) its exit."""

    exit_code: int
    reason: str
    message: str


def format_record(record: ExitRecord) -> str:
    """One JSON line that fits the kubelet's limit (the message is shortened, never the code)."""
    body = {"exitCode": record.exit_code, "reason": record.reason, "message": record.message}
    text = json.dumps(body)
    while len(text.encode()) > MAX_MESSAGE_BYTES - 1:
        body["message"] = body["message"][: len(body["message"]) // 2] + "..."
        text = json.dumps(body)
    return text + "\n"


def write_record(path: Path, record: ExitRecord) -> bool:
    """Write `record` unless another process already wrote one (first failure wins); True if written.

    The kubelet creates the file empty; outside a pod a missing directory means there is nobody to read it.
    """
    try:
        with path.open("a+", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0, 2)
            if handle.tell() > 0:
                return False
            handle.write(format_record(record))
            return True
    except OSError:
        return False


def parse_record(message: str | None) -> ExitRecord | None:
    """The record a termination message holds, if it is one (a log tail or free text is not)."""
    if not message:
        return None
    try:
        data = json.loads(message)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    code = data.get("exitCode")
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    return ExitRecord(code, str(data.get("reason") or ""), str(data.get("message") or ""))


def torchrun_root_cause(message: str | None) -> int | None:
    """The root cause's exit code in torchrun's ChildFailedError report (a signal -N becomes 128 + N)."""
    match = _TORCHRUN_ROOT_CAUSE.search(message or "")
    if match is None:
        return None
    code = int(match.group(1))
    return 128 - code if code < 0 else code


def recorded_exit_code(container_exit_code: int | None, message: str | None) -> int | None:
    """The code that explains a failed container: a record first, then torchrun's report, then its own.

    Only a non-zero exit is reinterpreted: a container that exited 0 succeeded whatever it wrote.
    """
    if not container_exit_code:
        return container_exit_code
    record = parse_record(message)
    if record is not None and record.exit_code != 0:
        return record.exit_code
    root_cause = torchrun_root_cause(message)
    if root_cause:
        return root_cause
    return container_exit_code
