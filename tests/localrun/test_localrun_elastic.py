"""Elastic training as real processes (`kubetrain run --local`): torchrun agents, the c10d rendezvous on a
store process of its own, the built-in trainer on real CIFAR-10 images. A worker lost is a worker
replaced; spec.workers scales a running job."""

from __future__ import annotations

import json
import os
import re
import signal
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubetrain_operator import api
from kubetrain_operator.local import elastic_run, group_run, processes

pytestmark = [pytest.mark.distributed, pytest.mark.trains, pytest.mark.slow, pytest.mark.timeout(1800)]
"""Real training on 2 shared cores: a run took up to 10 minutes under a load average of 20."""

SAMPLE_TARBALL = Path(__file__).resolve().parents[2] / "examples" / "data" / "cifar10-sample.tar.gz"

EPOCHS = 3
BATCH = 8
"""Per-process batch at maxWorkers 3: every world size trains with the global batch 24."""
WAIT = 420.0
"""A failsafe for waiting on the log, far beyond what any step needs; no assertion depends on it."""
ACCURACY_TOLERANCE = 0.05
"""How far the elastic run's validation accuracy may be from the fixed-size run's. The elastic trainer
keeps the global batch and resumes the newest checkpoint, so the two differ only by float reduction
order and the epoch replayed after a re-rendezvous: a few images of 40 in the validation split."""


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 real CIFAR-10 images per class from the committed sample: an ImageFolder root."""
    extracted = tmp_path_factory.mktemp("sample")
    with tarfile.open(SAMPLE_TARBALL) as archive:
        archive.extractall(extracted, filter="data")
    root = tmp_path_factory.mktemp("images")
    for class_dir in sorted((extracted / "cifar10-sample" / "train").iterdir()):
        (root / class_dir.name).mkdir()
        for image in sorted(class_dir.iterdir())[:40]:
            (root / class_dir.name / image.name).write_bytes(image.read_bytes())
    return root


SCALING_EPOCHS = 8
"""The epochs of the tests whose group changes mid-run (see the scaling test)."""


def manifest(
    name: str, workers: int, *, elastic: bool = True, batch: int = BATCH, epochs: int = EPOCHS
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "workers": workers,
        "trainer": {
            "epochs": epochs,
            "batch_size": batch,
            "device": "cpu",
            "width": 8,
            "log_every_steps": 1,
            "data": {"dataset": "imagefolder", "root": "/data"},
            "output_dir": "/output",
        },
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
        "storage": [
            {"name": "data", "mountPath": "/data", "emptyDir": {}},
            {"name": "output", "mountPath": "/output", "emptyDir": {}},
        ],
        "runPolicy": {"maxRestarts": 2},
    }
    if elastic:
        spec["elastic"] = {"minWorkers": 2, "maxWorkers": 3, "lastCallSeconds": 3}
    return {
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": spec,
    }


class Log:
    """The run's output, readable while it runs."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._changed = threading.Condition()

    def write(self, text: str) -> int:
        with self._changed:
            self._lines.append(text)
            self._changed.notify_all()
        return len(text)

    def flush(self) -> None:
        """Nothing is buffered."""

    def text(self) -> str:
        with self._changed:
            return "".join(self._lines)

    def wait_for(self, pattern: str, after: int = 0) -> int:
        """Block until `pattern` appears past offset `after`; returns the offset just past the match."""
        with self._changed:
            found = self._changed.wait_for(lambda: re.search(pattern, "".join(self._lines)[after:]), WAIT)
            assert found, f"{pattern!r} never appeared; log tail:\n{''.join(self._lines)[-4000:]}"
            return after + found.end()

    def world_sizes(self) -> list[int]:
        """The world size of every group rank 0 joined, in order."""
        return [int(n) for n in re.findall(r"joined process group: rank 0 of (\d+)", self.text())]


def run_in_background(
    run: Callable[[], processes.LocalResult],
) -> Iterator[Callable[[], processes.LocalResult]]:
    outcome: list[processes.LocalResult] = []
    thread = threading.Thread(target=lambda: outcome.append(run()), daemon=True)
    thread.start()

    def result() -> processes.LocalResult:
        thread.join(WAIT)
        assert outcome, "the run did not end"
        return outcome[0]

    yield result
    thread.join(WAIT)


def metrics(tmp_path: Path, name: str) -> dict[str, Any]:
    return json.loads((tmp_path / "output" / name / "metrics.json").read_text())


@pytest.mark.parametrize("lost", [1, 0], ids=["worker-1", "worker-0-first-rendezvous-host"])
def test_a_killed_worker_is_replaced_alone_and_the_survivors_train_on(
    lost: int, images: Path, tmp_path: Path
) -> None:
    # As many epochs as the scaling test: under the full suite's load the two survivors once trained to
    # the end of 3 epochs before the replacement could join them.
    job = api.TrainingJob.model_validate(manifest("lost", 3, epochs=SCALING_EPOCHS))
    directories = processes.mount_directories(job.spec, {"data": images}, tmp_path)
    log = Log()
    started: list[elastic_run.Member] = []
    nodes = [3]  # free "nodes": the lost worker's node is gone until the survivors train without it
    run = run_in_background(
        lambda: elastic_run.run_local_elastic(
            job, directories, log, capacity=lambda: nodes[0], on_start=started.append
        )
    )
    result = next(run)
    at = log.wait_for(r"rank 0 of 3")
    at = log.wait_for(rf"epoch 2/{SCALING_EPOCHS} step 3/", at)  # mid-epoch
    nodes[0] = 2
    victim = next(m for m in started if m.index == lost)
    victim.signal(signal.SIGKILL)
    at = log.wait_for(r"joined process group: rank 0 of 2", at)
    at = log.wait_for(rf"epoch \d+/{SCALING_EPOCHS} step \d+/", at)  # the survivors train on alone
    nodes[0] = 3
    log.wait_for(r"joined process group: rank 0 of 3", at)
    outcome = result()
    assert (outcome.phase, outcome.restarts) == ("Succeeded", 1), log.text()[-4000:]
    assert sorted((m.index, m.attempt) for m in started) == sorted([(0, 0), (1, 0), (2, 0), (lost, 1)]), (
        "only the killed worker was ever started again"
    )
    assert (
        f"worker {lost} exited with code 137 (killed by signal 9); replacing worker {lost} alone"
        in log.text()
    )
    assert (tmp_path / "output" / "lost" / "model.pt").is_file()


def test_scaling_a_running_job_from_2_to_3_and_back_trains_as_well_as_a_fixed_size_run(
    images: Path, tmp_path: Path
) -> None:
    path = tmp_path / "tj.yaml"
    # Longer than the other tests: the third worker's start and the re-rendezvous must come before the
    # two-worker group has trained every epoch (under the full suite's load, 3 epochs were over first).
    document = manifest("scaled", 2, epochs=SCALING_EPOCHS)
    path.write_text(yaml.safe_dump(document))
    job = processes.load_trainingjob(path)
    directories = processes.mount_directories(job.spec, {"data": images}, tmp_path)
    log = Log()
    started: list[elastic_run.Member] = []

    def scale(workers: int) -> None:  # the local `kubectl scale tj/scaled --replicas=N`
        document["spec"]["workers"] = workers
        path.write_text(yaml.safe_dump(document))

    run = run_in_background(
        lambda: elastic_run.run_local_elastic(
            job,
            directories,
            log,
            desired=elastic_run.manifest_workers(path, job.spec),
            on_start=started.append,
        )
    )
    result = next(run)
    at = log.wait_for(rf"epoch 1/{SCALING_EPOCHS} step 2/")
    scale(3)
    at = log.wait_for(r"joined process group: rank 0 of 3", at)
    at = log.wait_for(rf"epoch \d+/{SCALING_EPOCHS} step \d+/", at)
    scale(2)
    log.wait_for(r"joined process group: rank 0 of 2", at)
    outcome = result()
    assert (outcome.phase, outcome.restarts) == ("Succeeded", 0), log.text()[-4000:]
    sizes = log.world_sizes()
    assert [size for i, size in enumerate(sizes) if i == 0 or sizes[i - 1] != size][-3:] == [2, 3, 2], sizes
    assert sorted((m.index, m.attempt) for m in started)[:2] == [(0, 0), (1, 0)]
    assert [m.index for m in started].count(0) == 1 and [m.index for m in started].count(1) == 1, (
        "workers 0 and 1 were never restarted by scaling"
    )
    assert "removing worker 2" in log.text()

    fixed = api.TrainingJob.model_validate(
        manifest("fixed", 2, elastic=False, batch=BATCH * 3 // 2, epochs=SCALING_EPOCHS)
    )
    fixed_result = group_run.run_local(
        fixed, processes.mount_directories(fixed.spec, {"data": images}, tmp_path), log
    )
    assert fixed_result.phase == "Succeeded"
    elastic_accuracy = metrics(tmp_path, "scaled")["accuracy"]
    fixed_accuracy = metrics(tmp_path, "fixed")["accuracy"]
    assert elastic_accuracy > 0.15, "better than chance (0.1): the elastic run learned"
    assert abs(elastic_accuracy - fixed_accuracy) <= ACCURACY_TOLERANCE, (elastic_accuracy, fixed_accuracy)


def test_a_killed_rendezvous_store_restarts_the_whole_group_once_and_it_resumes_from_the_checkpoint(
    images: Path, tmp_path: Path
) -> None:
    job = api.TrainingJob.model_validate(manifest("storeless", 2))
    directories = processes.mount_directories(job.spec, {"data": images}, tmp_path)
    log = Log()
    started: list[elastic_run.Member] = []
    run = run_in_background(
        lambda: elastic_run.run_local_elastic(job, directories, log, on_start=started.append)
    )
    result = next(run)
    at = log.wait_for(r"epoch 2/3 step 2/")  # epoch 1 is checkpointed
    store = re.search(r"rendezvous store on 127\.0\.0\.1:\d+ \(pid (\d+)\)", log.text())
    assert store is not None, log.text()[-4000:]
    os.kill(int(store.group(1)), signal.SIGKILL)
    at = log.wait_for(
        r"the rendezvous store process exited with code -9; restarting the whole group with a new rendezvous "
        r"store \(restart 1 of 2\)",
        at,
    )
    at = log.wait_for(r"rendezvous store on 127\.0\.0\.1:\d+ \(pid \d+\)", at)
    log.wait_for(r"resumed from checkpoint \S+ in restart attempt 1: epoch [12] of 3", at)
    outcome = result()
    assert (outcome.phase, outcome.restarts) == ("Succeeded", 1), log.text()[-4000:]
    assert sorted((m.index, m.attempt) for m in started) == [(0, 0), (0, 1), (1, 0), (1, 1)], (
        "every worker was started again, once, at the new attempt"
    )
    assert len(metrics(tmp_path, "storeless")["epochs"]) == 3
