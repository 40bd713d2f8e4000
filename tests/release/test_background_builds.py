"""`make test`'s first step: the builds tests would otherwise start on first use run in the background.

The real builds take minutes and need the Go module proxy; these tests give `start_background_builds`
small scripts instead and watch what it does with them: the order, the priority, the detachment, the log.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from testcluster import binaries

pytestmark = pytest.mark.unit


def script(path: Path, body: str) -> tuple[str, ...]:
    path.write_text(body)
    return ("bash", str(path))


def test_the_builds_run_in_order_at_the_lowest_priority_in_a_session_of_their_own_and_log_there(
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    first = script(
        tmp_path / "first.sh",
        f"nice >{tmp_path}/first.nice; ps -o sid= -p $$ >{tmp_path}/first.sid; echo first built\n"
        f"while [ ! -e {release} ]; do sleep 0.05; done\n",
    )
    failing = script(tmp_path / "failing.sh", "echo failing build >&2; exit 1\n")
    last = script(tmp_path / "last.sh", f"echo last built; touch {tmp_path}/last.done\n")
    log = tmp_path / "cache" / "background-builds.log"

    builds = binaries.start_background_builds([first, failing, last], log)
    try:
        # It returned while the first build still waits for the test: nothing ran past it yet.
        started = tmp_path / "first.sid"
        deadline = time.monotonic() + 30
        while not (started.exists() and started.read_text().strip()):
            assert time.monotonic() < deadline, "the first build never started"
            time.sleep(0.05)
        assert builds.poll() is None
        assert not (tmp_path / "last.done").exists()
        assert int(started.read_text()) != os.getsid(0)
    finally:
        release.touch()
    assert builds.wait(timeout=30) == 0

    assert (tmp_path / "first.nice").read_text().strip() == "19"
    # One failed build does not stop the next: a test that needs its binary builds it and shows the error.
    assert (tmp_path / "last.done").exists()
    assert log.read_text().splitlines() == ["first built", "failing build", "last built"]
