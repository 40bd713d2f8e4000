"""The exit-code record: what a failing process writes, and which code a reader takes from a container."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubetrain_trainer import termination
from kubetrain_trainer.termination import ExitRecord

pytestmark = pytest.mark.unit

TORCHRUN_REPORT = """Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_10:00:01
  host      : w0
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 42) error: Signal 15 (SIGTERM) received by PID 42
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 42
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_10:00:00
  host      : w0
  rank      : 0 (local_rank: 0)
  exitcode  : {code} (pid: 41)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


@pytest.mark.parametrize(
    ("container_code", "message", "expected"),
    [
        (1, '{"exitCode": 3, "reason": "DATA_ERROR", "message": "no images"}\n', 3),
        (1, '{"exitCode": 2, "reason": "BAD_CONFIG", "message": "epochs"}', 2),
        (3, '{"exitCode": 3, "reason": "DATA_ERROR", "message": ""}', 3),
        (0, '{"exitCode": 3, "reason": "DATA_ERROR", "message": ""}', 0),
        (1, '{"exitCode": 0, "reason": "", "message": ""}', 1),
        (1, TORCHRUN_REPORT.format(code=3), 3),
        (1, TORCHRUN_REPORT.format(code=-9), 137),
        (1, TORCHRUN_REPORT.format(code=0).replace("Root Cause", "Other"), 1),
        (1, "Traceback ...\nRuntimeError: boom", 1),
        (137, None, 137),
        (None, '{"exitCode": 3}', None),
        (1, '{"exitCode": "3"}', 1),
        (1, "[1, 2]", 1),
    ],
    ids=[
        "torchrun-record",
        "record-config",
        "plain-record",
        "success-stays",
        "record-of-zero-ignored",
        "torchrun-report",
        "torchrun-report-signal",
        "no-root-cause",
        "free-text",
        "no-message",
        "no-exit-code",
        "code-not-int",
        "not-an-object",
    ],
)
def test_the_recorded_code_explains_a_failed_container(
    container_code: int | None, message: str | None, expected: int | None
) -> None:
    assert termination.recorded_exit_code(container_code, message) == expected


def test_the_first_failure_is_recorded_and_later_ones_leave_it(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    path.touch()  # the kubelet creates the file empty
    assert termination.write_record(path, ExitRecord(3, "DATA_ERROR", "no images under /data"))
    assert not termination.write_record(path, ExitRecord(130, "INTERRUPTED", "SIGTERM"))
    assert termination.parse_record(path.read_text()) == ExitRecord(3, "DATA_ERROR", "no images under /data")


def test_a_long_message_is_shortened_to_the_kubelet_limit_keeping_the_code(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    assert termination.write_record(path, ExitRecord(2, "BAD_CONFIG", "x" * 10_000))
    assert len(path.read_bytes()) <= termination.MAX_MESSAGE_BYTES
    record = termination.parse_record(path.read_text())
    assert record is not None and record.exit_code == 2 and record.message.startswith("xxx")


def test_nothing_is_written_where_no_kubelet_reads(tmp_path: Path) -> None:
    assert not termination.write_record(tmp_path / "missing-dir" / "log", ExitRecord(3, "DATA_ERROR", ""))
