"""`kubetrain run --local` runs real processes and applies the operator's group policies to them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubetrain_operator import api
from kubetrain_operator.local import group_run, processes

pytestmark = pytest.mark.distributed

# Commands name container paths (/job) and `python`, which local mode resolves to this venv's first.
# A worker program that records its env and fails on demand, keyed by the attempt the operator injects.
SCRIPT = """
import json, os, sys, time
out = os.environ["OUT"]
rank, attempt = os.environ["RANK"], os.environ["KUBETRAIN_RESTART_ATTEMPT"]
with open(f"{out}/rank{rank}-attempt{attempt}.json", "w") as f:
    json.dump({k: v for k, v in os.environ.items() if k.isupper()}, f)
fail = os.environ.get("FAIL_CODE")
if fail and rank == "1" and attempt in os.environ.get("FAIL_ATTEMPTS", "").split(","):
    sys.exit(int(fail))
time.sleep(float(os.environ.get("SLEEP", "0")))
"""


def _script_job(tmp_path: Path, workers: int, env: dict[str, str], max_restarts: int = 2) -> api.TrainingJob:
    (tmp_path / "script.py").write_text(SCRIPT)
    return api.TrainingJob.model_validate(
        {
            "apiVersion": "kubetrain.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "script"},
            "spec": {
                "workers": workers,
                "command": ["python", "/job/script.py"],
                "launcher": "plain",
                "env": [
                    {"name": "OUT", "value": "/job"},
                    *({"name": k, "value": v} for k, v in env.items()),
                ],
                "storage": [{"name": "work", "mountPath": "/job", "emptyDir": {}}],
                "runPolicy": {"maxRestarts": max_restarts},
            },
        }
    )


def test_group_succeeds_and_each_rank_saw_its_env(tmp_path: Path) -> None:
    job = _script_job(tmp_path, 3, {})
    result = group_run.run_local(job, processes.mount_directories(job.spec, {"work": tmp_path}, tmp_path))
    assert (result.phase, result.reason, result.restarts) == ("Succeeded", "AllWorkersSucceeded", 0)
    seen = [json.loads((tmp_path / f"rank{r}-attempt0.json").read_text()) for r in range(3)]
    assert [s["RANK"] for s in seen] == ["0", "1", "2"]
    assert {s["WORLD_SIZE"] for s in seen} == {"3"}
    assert len({s["MASTER_PORT"] for s in seen}) == 1


def test_retryable_failure_restarts_the_whole_group_once(tmp_path: Path) -> None:
    job = _script_job(tmp_path, 2, {"FAIL_CODE": "11", "FAIL_ATTEMPTS": "0"})
    result = group_run.run_local(job, processes.mount_directories(job.spec, {"work": tmp_path}, tmp_path))
    assert (result.phase, result.restarts) == ("Succeeded", 1)
    assert (tmp_path / "rank0-attempt1.json").exists(), "rank 0 was restarted with the group"


def test_non_retryable_exit_code_fails_without_restart_naming_worker_and_code(tmp_path: Path) -> None:
    job = _script_job(tmp_path, 2, {"FAIL_CODE": "2", "FAIL_ATTEMPTS": "0,1,2", "SLEEP": "30"})
    started = time.monotonic()
    result = group_run.run_local(job, processes.mount_directories(job.spec, {"work": tmp_path}, tmp_path))
    assert (result.phase, result.reason, result.restarts) == ("Failed", "NonRetryableExitCode", 0)
    assert "worker 1" in result.message and "2" in result.message, result.message
    assert time.monotonic() - started < 25, "rank 0 was stopped with the group instead of sleeping on"


def test_ctrl_c_stops_every_worker(tmp_path: Path) -> None:
    job = _script_job(tmp_path, 2, {"SLEEP": "120"})
    manifest = tmp_path / "tj.yaml"
    manifest.write_text(yaml.safe_dump(job.model_dump(mode="json", by_alias=True, exclude_none=True)))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubetrain_operator.cli",
            "run",
            "-f",
            str(manifest),
            "--local",
            "--mount",
            f"work={tmp_path}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Twice, in full suites beside other CPU-heavy work, the run did not exit within 60 s of SIGINT
        # (it passes alone). On a timeout SIGABRT makes faulthandler print where every thread was.
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"rank{r}-attempt0.json").exists() for r in range(2)):
        assert time.monotonic() < deadline, "workers never started"
        time.sleep(0.2)
    pids = [
        int(p)
        for p in subprocess.run(
            ["pgrep", "-f", str(tmp_path / "script.py")], check=False, capture_output=True, text=True
        ).stdout.split()
    ]
    assert len(pids) == 2
    process.send_signal(signal.SIGINT)
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        output, _ = process.communicate(timeout=30)
        pytest.fail(
            f"kubetrain run --local still ran 60 s after SIGINT; where its threads were:\n{output[-6000:]}"
        )
    assert process.returncode != 0
    assert "Interrupted" in output
    assert not subprocess.run(
        ["pgrep", "-f", str(tmp_path / "script.py")], check=False, capture_output=True
    ).stdout


@pytest.mark.trains
def test_built_in_trainer_runs_real_ddp_locally(tmp_path: Path) -> None:
    manifest = tmp_path / "tj.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubetrain.io/v1alpha1",
                "kind": "TrainingJob",
                "metadata": {"name": "tiny"},
                "spec": {
                    "workers": 2,
                    "trainer": {
                        "epochs": 1,
                        "batch_size": 16,
                        "device": "cpu",
                        "data": {"dataset": "fake", "fake_size": 64, "root": "/data"},
                        "output_dir": "/output",
                    },
                    "storage": [
                        {"name": "data", "mountPath": "/data", "emptyDir": {}},
                        {"name": "output", "mountPath": "/output", "emptyDir": {}},
                    ],
                },
            }
        )
    )
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubetrain_operator.cli",
            "run",
            "-f",
            str(manifest),
            "--local",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "[worker-0]" in completed.stdout and "rank 0 of 2" in completed.stdout
    assert "trainingjob/tiny: Succeeded" in completed.stdout
    assert (tmp_path / "output" / "tiny" / "model.pt").is_file()
    assert (tmp_path / "output" / "tiny" / "metrics.json").is_file()


def test_a_data_error_under_torchrun_fails_at_once_with_the_trainers_code(tmp_path: Path) -> None:
    job = api.TrainingJob.model_validate(
        {
            "apiVersion": "kubetrain.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "nodata"},
            "spec": {
                "workers": 1,
                "nprocPerWorker": 2,
                "trainer": {
                    "device": "cpu",
                    "data": {"dataset": "imagefolder", "root": "/data/missing"},
                    "output_dir": "/output",
                },
                "storage": [
                    {"name": "data", "mountPath": "/data", "emptyDir": {}},
                    {"name": "output", "mountPath": "/output", "emptyDir": {}},
                ],
                "runPolicy": {"maxRestarts": 2},
            },
        }
    )
    result = group_run.run_local(job, processes.mount_directories(job.spec, {}, tmp_path))
    assert (result.phase, result.reason, result.restarts) == ("Failed", "NonRetryableExitCode", 0)
    assert "exited with code 3 (data error)" in result.message, result.message
