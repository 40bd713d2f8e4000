"""A dataset that may be downloaded is loaded in turns (issue 26 defect 8): rank 0 first, then the first
process of every other worker, then the rest, a barrier between the turns. torchvision's CIFAR-10
download writes its archive and extracts it in place, so ranks downloading into one root at once tear each
other's files; in turns, the later ones find the files there (one shared volume) or download once per node
(a volume per node).

Ranks are threads here, the group's barrier a `threading.Barrier`: what is tested is who loads when.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from kubetrain_trainer import datasets, distributed
from kubetrain_trainer.components.training_data import load_training_data
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.datasets import LabeledImages
from kubetrain_trainer.distributed import WorldEnv

pytestmark = pytest.mark.unit

LOAD_SECONDS = 0.3
"""How long each rank's (stand-in) download takes: long enough that ranks loading at once overlap."""


def _load_in_threads(
    monkeypatch: pytest.MonkeyPatch, config: TrainerConfig, nodes: int, per_node: int
) -> dict[int, tuple[float, float]]:
    """Run `load_training_data` as the `nodes` x `per_node` ranks of a group; when each rank's
    `datasets.load` started and ended."""
    world_size = nodes * per_node
    group = threading.Barrier(world_size, timeout=30)
    monkeypatch.setattr(distributed, "barrier", lambda world: group.wait(), raising=False)
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (40, 3, 32, 32), dtype=torch.uint8, generator=generator)
    data = LabeledImages(images, torch.arange(40) % 10, [f"c{i}" for i in range(10)])
    split = datasets.SplitData(data, data.subset(torch.arange(0)), data.classes, None, mapped=False)
    spans: dict[int, tuple[float, float]] = {}

    def load(_config: Any, _seed: int, _budget: Any = None) -> datasets.SplitData:
        started = time.monotonic()
        time.sleep(LOAD_SECONDS)
        spans[int(threading.current_thread().name)] = (started, time.monotonic())
        return split

    monkeypatch.setattr(datasets, "load", load)
    errors: list[BaseException] = []

    def rank(index: int) -> None:
        world = WorldEnv(
            rank=index, world_size=world_size, local_rank=index % per_node, local_world_size=per_node
        )
        try:
            load_training_data(config, world, torch.device("cpu"))
        except BaseException as error:
            errors.append(error)
            group.abort()

    threads = [threading.Thread(target=rank, args=(index,), name=str(index)) for index in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert sorted(spans) == list(range(world_size))
    return spans


def _before(spans: dict[int, tuple[float, float]], first: list[int], then: list[int]) -> bool:
    """Whether every rank in `first` finished loading before any rank in `then` started."""
    return max(spans[r][1] for r in first) <= min(spans[r][0] for r in then)


def test_cifar10_is_loaded_by_rank_0_then_each_workers_first_process_then_the_rest(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = TrainerConfig(batch_size=4, data={"dataset": "cifar10", "root": str(tmp_path)})
    spans = _load_in_threads(monkeypatch, config, nodes=2, per_node=2)  # ranks 0, 1 | 2, 3
    assert _before(spans, [0], [1, 2, 3]), spans
    assert _before(spans, [2], [1, 3]), spans


def test_a_single_worker_loads_rank_0_first_then_its_other_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = TrainerConfig(batch_size=4, data={"dataset": "cifar10", "root": str(tmp_path)})
    spans = _load_in_threads(monkeypatch, config, nodes=1, per_node=3)
    assert _before(spans, [0], [1, 2]), spans


def test_an_image_folder_is_loaded_in_turns_so_one_process_per_node_writes_its_decoded_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The decoded cache is written once per node: by rank 0 and each worker's first process, while the
    others wait and then find it current (memory-mapped by all of them on the disk path)."""
    config = TrainerConfig(batch_size=4, data={"dataset": "imagefolder", "root": str(tmp_path)})
    spans = _load_in_threads(monkeypatch, config, nodes=2, per_node=2)
    assert _before(spans, [0], [1, 2, 3]), spans
    assert _before(spans, [2], [1, 3]), spans


@pytest.mark.parametrize(
    "data",
    [
        {"dataset": "imagefolder", "cache_decoded": False, "cache": "memory"},
        {"dataset": "fake"},
    ],
    ids=["imagefolder-without-cache", "fake"],
)
def test_data_that_writes_no_shared_file_is_loaded_by_every_rank_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data: dict[str, Any]
) -> None:
    config = TrainerConfig(batch_size=4, data={**data, "root": str(tmp_path)})
    spans = _load_in_threads(monkeypatch, config, nodes=2, per_node=1)
    assert not _before(spans, [0], [1]), "no rank waits for another where nothing is written"
