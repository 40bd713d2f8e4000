"""Real multi-process DDP on CPU with gloo: replicas agree, scaling out preserves the maths, and a group
that loses a process resumes from its last checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from kubetrain_trainer import models
from kubetrain_trainer.exit_codes import ExitCode
from testcluster.processes import free_port
from trainer_helpers import kubetrain, start_ranks, trainer_env, wait_all

pytestmark = [pytest.mark.distributed, pytest.mark.trains]

WORKER = str(Path(__file__).with_name("ddp_worker.py"))


def _fake_config(output: Path, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model": "simple_cnn",
        "epochs": 2,
        "batch_size": 16,
        "seed": 3,
        "cpu_threads": 1,
        "output_dir": str(output),
        "data": {"dataset": "fake", "fake_size": 160, "validation_fraction": 0.2},
        "optimizer": {"lr": 0.05, "momentum": 0.9},
    }
    config.update(overrides)
    return config


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def _initial_weights(seed: int) -> dict[str, torch.Tensor]:
    """SimpleCNN as the trainer initialises it for `seed` (it seeds torch before building the model)."""
    torch.manual_seed(seed)
    return models.SimpleCNN().state_dict()


def test_two_gloo_ranks_end_with_identical_weights(tmp_path: Path) -> None:
    results = wait_all(start_ranks([WORKER], _fake_config(tmp_path), world_size=2, job="replicas"))
    for code, output in results:
        assert code == 0, output
    rank0, rank1 = _weights(tmp_path / "replicas" / "rank0.pt"), _weights(tmp_path / "replicas" / "rank1.pt")
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    assert not torch.equal(rank0["fc2.weight"], _initial_weights(seed=3)["fc2.weight"])  # really trained


def test_two_ranks_of_batch_b_match_one_rank_of_batch_2b(tmp_path: Path) -> None:
    two = start_ranks([WORKER], _fake_config(tmp_path, batch_size=16), world_size=2, job="two")
    one = start_ranks([WORKER], _fake_config(tmp_path, batch_size=32), world_size=1, job="one")
    for code, output in wait_all(two + one):
        assert code == 0, output
    split, single = _weights(tmp_path / "two" / "rank0.pt"), _weights(tmp_path / "one" / "rank0.pt")
    start = _initial_weights(seed=3)
    for name in single:
        assert torch.allclose(split[name], single[name], atol=1e-4, rtol=1e-3), name
    moved = max(float((single[n] - start[n]).abs().max()) for n in single)
    assert moved > 1e-2  # the runs trained for real, so agreeing is not trivial


def _progress(job_dir: Path) -> dict[str, Any]:
    return json.loads((job_dir / "progress.json").read_text())


def test_group_restarted_after_a_rank_is_killed_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    config = _fake_config(
        tmp_path,
        epochs=4,
        batch_size=8,
        data={"dataset": "fake", "fake_size": 480, "validation_fraction": 0.1},
    )
    config["collective_timeout_seconds"] = 60
    job_dir = tmp_path / "kill"
    command = ["-m", "kubetrain_trainer.cli", "train"]
    procs = start_ranks(command, config, world_size=2, job="kill")
    deadline = time.monotonic() + 180
    while not list((job_dir / "checkpoints").glob("attempt-0000-epoch-000001-step-*.pt.sha256")):
        assert time.monotonic() < deadline, "no checkpoint appeared"
        assert all(p.poll() is None for p in procs), "training ended before it could be interrupted"
        time.sleep(0.1)
    procs[1].send_signal(signal.SIGKILL)
    (code0, out0), (code1, _) = wait_all(procs, timeout=120)
    assert code1 == -signal.SIGKILL
    assert code0 == ExitCode.PEER_LOST, out0
    assert not (job_dir / "model.pt").exists()
    interrupted_at = _progress(job_dir)["epoch"]
    assert 1 <= interrupted_at < 4

    results = wait_all(start_ranks(command, config, world_size=2, job="kill"))
    assert [code for code, _ in results] == [0, 0], results[0][1]
    assert "resumed from checkpoint" in results[0][1]
    resumed = int(results[0][1].split("resumed from checkpoint")[1].split("epoch ")[1].split()[0])
    assert resumed >= interrupted_at - 1  # at most one checkpoint interval lost
    assert _progress(job_dir)["epoch"] == 4
    history = json.loads((job_dir / "metrics.json").read_text())["epochs"]
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    config = _fake_config(tmp_path, epochs=2, keep_checkpoints=3)
    env = trainer_env(config, KUBETRAIN_JOB_NAME="corrupt")
    assert kubetrain("train", env=env).returncode == 0
    (newest,) = (tmp_path / "corrupt" / "checkpoints").glob("attempt-0000-epoch-000002-step-*.pt")
    newest.write_bytes(newest.read_bytes()[:1000])

    result = kubetrain("train", "--epochs", "3", env=env)
    assert result.returncode == 0, result.stderr
    assert f"{newest.name} (epoch 2) is corrupt" in result.stderr
    assert "in restart attempt 0: epoch 1 of 3, step" in result.stderr
    history = json.loads((tmp_path / "corrupt" / "metrics.json").read_text())["epochs"]
    assert [h["epoch"] for h in history] == [1, 2, 3]


def test_two_ranks_resumed_mid_epoch_end_with_the_weights_of_a_group_never_interrupted(
    tmp_path: Path,
) -> None:
    """Mid-epoch checkpoints under DDP: the clock flag's broadcast and the partial loss totals summed over
    ranks; a 2-value gloo sum does not depend on the order, so the comparison is exact."""
    config = _fake_config(
        tmp_path, model="resnet_small", width=8, epochs=3, batch_size=8, augment=True, keep_checkpoints=50
    )
    # 128 training images / (2 x 8): 8 steps an epoch. Every 3 steps, and every second of rank 0's clock
    # (read at step 20): which extra checkpoints the clock adds does not change the weights.
    config.update(checkpoint_every_steps=3, checkpoint_every_seconds=1)
    command = ["-m", "kubetrain_trainer.cli", "train"]
    results = wait_all(start_ranks(command, config, world_size=2, job="whole"))
    assert [code for code, _ in results] == [0, 0], results[0][1]
    # What a group killed right after its step-12 checkpoint (4 steps into epoch 2) leaves behind:
    checkpoint_and_digest = sorted((tmp_path / "whole" / "checkpoints").glob("*-step-0000000012.pt*"))
    assert len(checkpoint_and_digest) == 2
    resumed_dir = tmp_path / "resumed" / "checkpoints"
    resumed_dir.mkdir(parents=True)
    for path in checkpoint_and_digest:
        (resumed_dir / path.name).write_bytes(path.read_bytes())

    results = wait_all(start_ranks(command, config, world_size=2, job="resumed"))
    assert [code for code, _ in results] == [0, 0], results[0][1]
    assert "epoch 2 of 3, step 12 (4 of 8 steps of epoch 2 done)" in results[0][1]
    whole = torch.load(tmp_path / "whole" / "model.pt", weights_only=True)["state_dict"]
    resumed = torch.load(tmp_path / "resumed" / "model.pt", weights_only=True)["state_dict"]
    for name in whole:
        assert torch.equal(resumed[name], whole[name]), name
    losses = [
        [e["train_loss"] for e in json.loads((tmp_path / job / "metrics.json").read_text())["epochs"]]
        for job in ("whole", "resumed")
    ]
    assert losses[0] == losses[1]


def test_torchrun_with_two_processes_per_worker_joins_through_the_agent_store(tmp_path: Path) -> None:
    """The operator's command for procsPerWorker 2: `torchrun --no-python kubetrain train` with PET_* env."""
    bin_dir = Path(sys.executable).parent
    port = str(free_port())
    env = trainer_env(
        _fake_config(tmp_path, epochs=1),
        KUBETRAIN_JOB_NAME="torchrun",
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
        WORLD_SIZE="2",
        RANK="0",
        NODE_RANK="0",
        LOCAL_WORLD_SIZE="2",
        PET_NNODES="1",
        PET_NPROC_PER_NODE="2",
        PET_NODE_RANK="0",
        PET_MASTER_ADDR="127.0.0.1",
        PET_MASTER_PORT=port,
    )
    result = subprocess.run(
        [str(bin_dir / "torchrun"), "--no-python", "kubetrain", "train"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "joined torchrun process group: rank 0 of 2" in result.stderr
    assert _progress(tmp_path / "torchrun")["epoch"] == 1


def test_two_rank_validation_reports_the_accuracy_of_the_saved_model(
    tmp_path: Path, sample_root: Path
) -> None:
    """With batch norm every rank's running statistics differ; the report must be rank 0's model's."""
    config = _fake_config(
        tmp_path,
        model="resnet_small",
        width=8,
        epochs=1,
        batch_size=8,
        data={"dataset": "imagefolder", "root": str(sample_root), "validation_fraction": 0.5},
    )
    results = wait_all(start_ranks(["-m", "kubetrain_trainer.cli", "train"], config, world_size=2, job="bn"))
    assert [code for code, _ in results] == [0, 0], results[0][1]
    metrics = json.loads((tmp_path / "bn" / "metrics.json").read_text())

    evaluated = kubetrain("evaluate", str(tmp_path / "bn" / "model.pt"), "--json", "--device", "cpu")
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads(evaluated.stdout)
    assert report["images"] == sum(map(sum, metrics["confusion_matrix"])) == 1500
    assert report["confusion_matrix"] == metrics["confusion_matrix"]  # to the image
    assert report["accuracy"] == metrics["accuracy"]
