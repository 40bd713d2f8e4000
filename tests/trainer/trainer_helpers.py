"""Helpers for trainer tests: trainer subprocesses, one or several ranks.

Trainer processes run with one intra-op thread each: the test machines have 2 cores shared with other
suites, and 2-rank DDP tests would otherwise oversubscribe them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from kubetrain_trainer.checkpoints import Checkpointer
from testcluster.processes import free_port

REPO = Path(__file__).resolve().parents[2]
SAMPLE_TARBALL = REPO / "examples" / "data" / "cifar10-sample.tar.gz"
PREDICT_DIR = REPO / "examples" / "data" / "predict"


def trainer_env(config: Mapping[str, Any], **extra: str) -> dict[str, str]:
    """Environment of a trainer process: the config as the operator passes it, one thread, no pod."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETRAIN_", "MASTER_", "PET_"))}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        env.pop(name, None)
    env.update(
        {
            "KUBETRAIN_TRAINER_CONFIG": json.dumps(config),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }
    )
    return env


def kubetrain(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run `kubetrain_trainer.cli` as the operator's pods do and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "kubetrain_trainer.cli", *args],
        env=dict(env) if env is not None else trainer_env({}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_ranks(
    command: list[str],
    config: Mapping[str, Any],
    world_size: int,
    job: str,
    port: int | None = None,
    **extra: str,
) -> list[subprocess.Popen[str]]:
    """Start `world_size` processes of `command` as ranks of one group on localhost (`extra`: more
    environment, such as KUBETRAIN_RESTART_ATTEMPT)."""
    port = port or free_port()
    procs = []
    for rank in range(world_size):
        env = trainer_env(
            config,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world_size),
            RANK=str(rank),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            KUBETRAIN_JOB_NAME=job,
            **extra,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, *command],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def wait_all(procs: list[subprocess.Popen[str]], timeout: float = 240) -> list[tuple[int, str]]:
    """(exit code, output) of every process, killing all of them if any overruns `timeout`."""
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def constant_linear(value: float) -> torch.nn.Linear:
    """A 2x2 linear model whose weights all equal `value`: a checkpoint of it says by its values alone
    which one was loaded."""
    model = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(model.weight, value)
    return model


def save_step_checkpoint(writer: Checkpointer, epoch: int, step: int) -> Path:
    """Save a checkpoint whose model's weights equal `step`."""
    return writer.save(epoch, step, {"model": constant_linear(float(step))}, {})
