"""The heartbeat contract: each worker's `kubetrain.io/heartbeat` annotation {step, stepAt, updatedAt},
patched every KUBETRAIN_HEARTBEAT_SECONDS by a thread that goes on while training is stuck."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pod_api
import pytest
import torch
from kubetrain_trainer import contract, heartbeat
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.failures import ConfigError
from kubetrain_trainer.progress import SERVICE_ACCOUNT_DIR_ENV, PodAnnotator
from kubetrain_trainer.trainer import build_trainer
from testcluster import pki
from testcluster.processes import free_port
from testcluster.waiting import wait_for
from trainer_helpers import kubetrain, trainer_env

T0 = 1_764_950_400.0
"""2025-12-05T16:00:00Z, a Unix time for the injected clocks."""


class Clock:
    """A clock the test sets; read by the code under test from any thread."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> Iterator[pod_api.PodApi]:
    with pod_api.serving() as served:
        yield served


def annotator_of(api: pod_api.PodApi, tmp_path: Path) -> PodAnnotator:
    token = tmp_path / "token"
    token.write_text("worker-token\n")
    return PodAnnotator(api.url, "team-a", "job-worker-1", token, None)


def heartbeat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == heartbeat.THREAD_NAME]


@pytest.mark.unit
def test_the_record_holds_the_step_when_progress_was_made_and_when_it_was_written() -> None:
    assert heartbeat.heartbeat_record(1200, T0 + 0.9, T0 + 75.2) == {
        "step": 1200,
        "stepAt": "2025-12-05T16:00:00Z",
        "updatedAt": "2025-12-05T16:01:15Z",
    }


@pytest.mark.unit
def test_the_tick_keeps_the_last_step_and_when_any_progress_was_made() -> None:
    clock = Clock()
    tick = heartbeat.ProgressTick(step=480, clock=clock)  # a run resumed at step 480
    assert tick.last() == (480, T0)  # before the first tick: the start, at the resumed step
    clock.now = T0 + 5
    tick(481)  # an optimizer step
    assert tick.last() == (481, T0 + 5)
    clock.now = T0 + 9
    tick()  # an evaluation batch, a checkpoint written: progress at the same step
    assert tick.last() == (481, T0 + 9)


@pytest.mark.unit
def test_the_period_comes_from_the_environment_and_must_be_a_positive_number() -> None:
    assert heartbeat.period_from_environment({}) is None
    assert heartbeat.period_from_environment({contract.HEARTBEAT_SECONDS: ""}) is None
    assert heartbeat.period_from_environment({contract.HEARTBEAT_SECONDS: "15"}) == 15.0
    assert heartbeat.period_from_environment({contract.HEARTBEAT_SECONDS: "0.5"}) == 0.5
    for bad in ("0", "-5", "soon", "nan", "inf"):
        with pytest.raises(ConfigError, match=f"{contract.HEARTBEAT_SECONDS}='{bad}'"):
            heartbeat.period_from_environment({contract.HEARTBEAT_SECONDS: bad})


@pytest.mark.unit
def test_failures_are_told_once_then_at_most_every_few_minutes_and_recovery_once() -> None:
    failures = heartbeat.FailureLog(every=300)
    error = OSError("connection refused")
    first = failures.failed(error, now=0)
    assert first is not None and first.startswith("connection refused;")
    assert [failures.failed(error, now=t) for t in (15, 30, 299)] == [None, None, None]
    again = failures.failed(error, now=301)
    assert again is not None and "(3 more failed since the last warning)" in again
    assert failures.failed(error, now=316) is None
    assert failures.succeeded() == "heartbeat patches get through again after 6 failed"
    assert failures.succeeded() is None
    assert failures.failed(error, now=320) is not None  # a new run of failures is told at once


@pytest.mark.unit
def test_patches_arrive_every_period_with_the_step_and_time_of_the_last_progress(
    api: pod_api.PodApi, tmp_path: Path
) -> None:
    clock = Clock()
    tick = heartbeat.ProgressTick(clock=clock)
    beating = heartbeat.Heartbeat(tick, annotator_of(api, tmp_path), period=0.05, clock=clock).start()
    try:
        for step in (1, 2, 3):
            clock.now = T0 + 10 * step
            tick(step)
            wait_for(
                lambda step=step: [
                    r for r in api.annotations(contract.HEARTBEAT_ANNOTATION) if r["step"] == step
                ],
                f"a heartbeat at step {step}",
                timeout=30,
                interval=0.05,
            )
        # No progress: the patches go on, with the last step and its time, and a fresher updatedAt.
        clock.now = T0 + 45
        sent = len(api.requests)
        wait_for(lambda: len(api.requests) >= sent + 3, "three more heartbeats", timeout=30, interval=0.05)
    finally:
        beating.stop(timeout=10)
    assert not heartbeat_threads()
    records = api.annotations(contract.HEARTBEAT_ANNOTATION)
    assert len(records) == len(api.requests)  # every patch is the heartbeat, nothing else
    for step in (1, 2, 3):
        step_at = heartbeat.rfc3339(T0 + 10 * step)
        assert {r["stepAt"] for r in records if r["step"] == step} == {step_at}
    steps = [r["step"] for r in records]
    assert steps == sorted(steps)
    assert records[-1] == {
        "step": 3,
        "stepAt": heartbeat.rfc3339(T0 + 30),
        "updatedAt": heartbeat.rfc3339(T0 + 45),
    }
    request = api.requests[-1]
    assert request["path"] == "/api/v1/namespaces/team-a/pods/job-worker-1"
    assert request["headers"]["Content-Type"] == "application/merge-patch+json"
    assert request["headers"]["Authorization"] == "Bearer worker-token"


@pytest.mark.unit
def test_a_refused_patch_warns_once_and_the_heartbeat_goes_on(
    api: pod_api.PodApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api.status = 403
    tick = heartbeat.ProgressTick()
    with caplog.at_level(logging.INFO, logger=heartbeat.__name__):
        beating = heartbeat.Heartbeat(tick, annotator_of(api, tmp_path), period=0.05).start()
        try:
            wait_for(lambda: len(api.requests) >= 6, "six refused heartbeats", timeout=30, interval=0.05)
            api.status = 200
            wait_for(
                lambda: "get through again" in caplog.text,
                "the heartbeat's recovery",
                timeout=30,
                interval=0.05,
            )
        finally:
            beating.stop(timeout=10)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "could not patch pod team-a/job-worker-1 heartbeat annotation: HTTP Error 403"
    )


@pytest.mark.unit
def test_no_thread_and_no_patch_without_the_variable_outside_a_pod_or_in_a_pods_other_processes(
    api: pod_api.PodApi, tmp_path: Path
) -> None:
    annotator = annotator_of(api, tmp_path)
    tick = heartbeat.ProgressTick()
    asked = {contract.HEARTBEAT_SECONDS: "0.05"}
    assert heartbeat.start(WorldEnv(), tick, annotator, env={}) is None
    assert heartbeat.start(WorldEnv(), tick, None, env=asked) is None
    # Under torchrun the pod's LOCAL_RANK 0 reports for it; its other processes do not.
    pods_second_process = WorldEnv(rank=5, world_size=8, local_rank=1, local_world_size=4)
    assert heartbeat.start(pods_second_process, tick, annotator, env=asked) is None
    assert not heartbeat_threads()
    assert api.requests == []
    # The same call with all three given does start one (so the Nones above are the conditions' doing).
    pods_first_process = WorldEnv(rank=4, world_size=8, local_rank=0, local_world_size=4)
    beating = heartbeat.start(pods_first_process, tick, annotator, env=asked)
    assert beating is not None
    try:
        assert [t.daemon for t in heartbeat_threads()] == [True]  # never keeps the process alive
        wait_for(lambda: api.requests, "the first heartbeat", timeout=30, interval=0.05)
    finally:
        beating.stop(timeout=10)


@pytest.mark.unit
def test_the_trainer_ticks_on_every_step_validation_batch_and_checkpoint(tmp_path: Path) -> None:
    """build_trainer gives the loop, the evaluator and checkpointing one tick; each tells it of its
    progress. (No heartbeat reads it here: no pod.)"""
    config = TrainerConfig.model_validate(
        {
            "epochs": 2,
            "batch_size": 16,
            "output_dir": str(tmp_path),
            "data": {"dataset": "fake", "fake_size": 96, "validation_fraction": 0.25},
        }
    )
    torch.set_num_threads(1)
    trainer = build_trainer(config, WorldEnv(), "ticks")
    assert trainer.loop.tick is trainer.evaluator.tick is trainer.checkpoints.tick
    calls: dict[str, list[int | None]] = {"loop": [], "evaluator": [], "checkpoints": []}

    class Recording(heartbeat.ProgressTick):
        def __init__(self, part: str) -> None:
            super().__init__()
            self.part = part

        def __call__(self, step: int | None = None) -> None:
            calls[self.part].append(step)
            super().__call__(step)

    trainer.loop.tick = Recording("loop")
    trainer.evaluator.tick = Recording("evaluator")
    trainer.checkpoints.tick = Recording("checkpoints")
    trainer.train()
    steps = trainer.state.progress.step
    assert steps == 2 * trainer.loop.length.steps_per_epoch > 0
    assert calls["loop"] == list(range(1, steps + 1))
    assert calls["evaluator"] == [None, None]  # 24 validation images: one batch per epoch
    assert calls["checkpoints"] and set(calls["checkpoints"]) == {None}


@pytest.mark.trains
def test_kubetrain_train_in_a_pod_sends_heartbeats_only_when_the_operator_asks(tmp_path: Path) -> None:
    """`kubetrain train` with a pod's environment (service-account token, the API server's CA) patches
    its own pod's heartbeat annotation when KUBETRAIN_HEARTBEAT_SECONDS is set, and sends no heartbeat
    without it; the progress reports reach the same server both times."""
    tls = pki.create_serving_pair(tmp_path / "tls", "kube-apiserver")
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("worker-token\n")
    shutil.copy(tls.ca_cert, account / "ca.crt")
    config = {
        "epochs": 2,
        "batch_size": 16,
        "cpu_threads": 1,
        "output_dir": str(tmp_path / "output"),
        "data": {"dataset": "fake", "fake_size": 96, "validation_fraction": 0.25},
    }
    with pod_api.serving(tls) as api:
        pod = {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": api.url.rsplit(":", 1)[1],
            contract.POD_NAME: "job-worker-0",
            contract.POD_NAMESPACE: "team-a",
            SERVICE_ACCOUNT_DIR_ENV: str(account),
        }
        asked = kubetrain(
            "train",
            env=trainer_env(config, KUBETRAIN_JOB_NAME="asked", KUBETRAIN_HEARTBEAT_SECONDS="1", **pod),
        )
        assert asked.returncode == 0, asked.stderr
        first_run = api.requests
        quiet = kubetrain("train", env=trainer_env(config, KUBETRAIN_JOB_NAME="quiet", **pod))
        assert quiet.returncode == 0, quiet.stderr
        second_run = api.requests[len(first_run) :]

    def annotations(requests: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
        values = [r["body"]["metadata"]["annotations"].get(key) for r in requests]
        return [json.loads(value) for value in values if value is not None]

    assert {r["path"] for r in first_run + second_run} == {"/api/v1/namespaces/team-a/pods/job-worker-0"}
    beats = annotations(first_run, contract.HEARTBEAT_ANNOTATION)
    final_step = annotations(first_run, contract.PROGRESS_ANNOTATION)[-1]["step"]
    assert beats and final_step > 0
    assert [set(b) for b in beats] == [{"step", "stepAt", "updatedAt"}] * len(beats)
    steps = [b["step"] for b in beats]
    assert steps == sorted(steps) and 0 <= steps[-1] <= final_step
    assert (
        "heartbeat: patching pod team-a/job-worker-0 annotation kubetrain.io/heartbeat every 1 s"
        in asked.stderr
    )
    assert (
        len(annotations(second_run, contract.PROGRESS_ANNOTATION)) == 2
    )  # one per epoch: the server heard it
    assert annotations(second_run, contract.HEARTBEAT_ANNOTATION) == []
    assert "heartbeat" not in quiet.stderr


@pytest.mark.distributed
def test_while_a_collective_hangs_updated_at_advances_and_step_at_does_not(
    api: pod_api.PodApi, tmp_path: Path
) -> None:
    """Rank 0 of a real 2-process gloo group blocks in an all_reduce that rank 1 never joins; its
    heartbeat thread goes on patching: the operator sees a live worker that makes no progress."""
    token = tmp_path / "token"
    token.write_text("worker-token\n")
    port = free_port()
    procs, logs = [], []
    for rank in (0, 1):
        env = trainer_env(
            {},
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE="2",
            RANK=str(rank),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            KUBETRAIN_HEARTBEAT_SECONDS="1",
            HEARTBEAT_TEST_API=api.url,
            HEARTBEAT_TEST_TOKEN=str(token),
        )
        logs.append(tmp_path / f"rank{rank}.log")
        with logs[-1].open("w") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(Path(__file__).with_name("heartbeat_worker.py"))],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    try:

        def explain() -> str:
            return "\n".join(f"{log.name}:\n{log.read_text()}" for log in logs)

        wait_for(
            lambda: "blocking in all_reduce" in logs[0].read_text(), "rank 0 to block", 120, explain=explain
        )
        blocked_at = len(api.requests)
        wait_for(
            lambda: len(api.requests) >= blocked_at + 4, "four heartbeats while blocked", 60, explain=explain
        )
        assert procs[0].poll() is None, explain()  # still in the all_reduce
        assert "all_reduce returned" not in logs[0].read_text()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    records = api.annotations(contract.HEARTBEAT_ANNOTATION)[blocked_at:]
    assert {r["step"] for r in records} == {3}
    assert len({r["stepAt"] for r in records}) == 1
    updated = [r["updatedAt"] for r in records]
    assert updated == sorted(updated) and updated[-1] > updated[0]
    assert records[-1]["updatedAt"] > records[-1]["stepAt"]
