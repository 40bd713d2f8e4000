"""Under real torchrun (which exits 1 for any failed child) the operator still reads the child's code.

The pod is played by hand: the container's exit code is torchrun's, and its termination message is what
the kubelet would copy, the termination-log file or, when that is empty, the tail of the log.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubetrain_operator.planning import observe
from kubetrain_trainer.exit_codes import ExitCode
from testcluster.processes import free_port
from trainer_helpers import trainer_env

pytestmark = pytest.mark.distributed

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
KUBETRAIN = str(Path(sys.executable).with_name("kubetrain"))


def _torchrun(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    port = str(free_port())
    argv = [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    argv += ["--master-port", port, "--no-python", *command]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)


def _kubelet_fallback_message(log: str) -> str:
    """FallbackToLogsOnError: the last 80 lines of the log, at most 2048 bytes of them."""
    tail = "\n".join(log.splitlines()[-80:])
    return tail.encode()[-2048:].decode(errors="replace")


def _terminated_pod(exit_code: int, message: str) -> dict[str, Any]:
    terminated = {"exitCode": exit_code, "reason": "Error", "message": message}
    return {
        "metadata": {"name": "job-r0-w0-abcde"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "worker", "state": {"terminated": terminated}}],
        },
    }


def _missing_data_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A trainer environment whose data root does not exist (exit 3), and its termination-log file."""
    termination_log = tmp_path / "termination-log"
    termination_log.touch()
    config = {
        "data": {"dataset": "imagefolder", "root": str(tmp_path / "no-data")},
        "output_dir": str(tmp_path),
    }
    return trainer_env(config, KUBETRAIN_TERMINATION_LOG=str(termination_log)), termination_log


def test_the_trainers_data_error_under_torchrun_is_the_recorded_exit_code(tmp_path: Path) -> None:
    env, termination_log = _missing_data_env(tmp_path)
    result = _torchrun([KUBETRAIN, "train"], env)
    assert result.returncode == 1, result.stderr  # torchrun's own code: what the container exits with
    worker = observe.read_pod(
        _terminated_pod(result.returncode, termination_log.read_text()), 0, 0, "job-r0-w0"
    )
    assert worker.exit_code == ExitCode.DATA_ERROR, (termination_log.read_text(), result.stderr[-3000:])
    assert "no-data" in (worker.message or "")


def test_a_user_scripts_exit_code_under_torchrun_is_read_from_torchruns_report(tmp_path: Path) -> None:
    env = trainer_env({})
    result = _torchrun(["sh", "-c", "echo failing; exit 3"], env)
    assert result.returncode == 1, result.stderr
    message = _kubelet_fallback_message(result.stdout + result.stderr)
    worker = observe.read_pod(_terminated_pod(result.returncode, message), 0, 0, "job-r0-w0")
    assert worker.exit_code == 3, message


def test_a_permanent_failure_under_a_restarting_torchrun_is_not_retried_in_the_pod(tmp_path: Path) -> None:
    """Elastic workers run torchrun with --max-restarts: a data error must end the container at once."""
    env, termination_log = _missing_data_env(tmp_path)
    argv = [TORCHRUN, "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3"]
    argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "t"]
    argv += ["--no-python", KUBETRAIN, "train"]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert output.count("(exit code 3, DATA_ERROR)") == 1, output[-3000:]
    worker = observe.read_pod(
        _terminated_pod(result.returncode, termination_log.read_text()), 0, 0, "job-r0-w0"
    )
    assert worker.exit_code == ExitCode.DATA_ERROR
