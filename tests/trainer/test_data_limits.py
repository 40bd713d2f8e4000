"""Inputs that cannot work fail early with a permanent code: seeds past the generators' range (schema) and
data sets larger than the memory a worker may ever have (exit 3 before decoding anything)."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import torch
from kubetrain_trainer import batches, datasets, memory
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.exit_codes import ExitCode
from kubetrain_trainer.failures import DataError
from kubetrain_trainer.preprocessing import Preprocessing
from trainer_helpers import kubetrain, trainer_env

GIB = 1 << 30


@pytest.mark.unit
def test_a_seed_past_the_generators_range_is_refused_by_the_schema() -> None:
    assert TrainerConfig.model_validate({"seed": 2**32 - 1}).seed == 2**32 - 1
    with pytest.raises(pydantic.ValidationError, match="seed"):
        TrainerConfig.model_validate({"seed": 5_000_000_000})


@pytest.mark.unit
def test_the_largest_seed_draws_batches_in_the_last_epoch() -> None:
    images = torch.zeros(8, 3, 8, 8, dtype=torch.uint8)
    data = datasets.LabeledImages(images, torch.arange(8) % 2, ["a", "b"])
    loader = batches.BatchLoader(
        data,
        Preprocessing(8, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
        batch_size=2,
        rank=1,
        world_size=2,
        seed=2**32 - 1,
        augment=True,
        device=torch.device("cpu"),
    )
    loader.set_epoch(10_000)  # the schema's largest epochs
    assert len(list(loader)) == 2


@pytest.mark.unit
def test_an_out_of_range_seed_flag_exits_2_naming_the_field() -> None:
    result = kubetrain("train", "--seed", "5000000000", env=trainer_env({"data": {"dataset": "fake"}}))
    assert result.returncode == ExitCode.BAD_CONFIG, result.stderr
    assert "seed" in result.stderr


@pytest.mark.unit
@pytest.mark.parametrize(
    ("data", "processes", "limit", "cache", "held"),
    [
        ((50_000, 32, False), 1, 2 * GIB, "auto", "memory"),
        ((50_000, 32, True), 8, 8 * GIB, "auto", "memory"),
        ((50_000, 32, True), 8, 2 * GIB, "auto", "disk"),  # padded copies for augment count too
        ((50_000, 32, True), 8, 2 * GIB, "memory", None),  # refused: memory was asked for
        ((1_000_000, 224, False), 1, 64 * GIB, "auto", "disk"),  # 150 GB decoded
        ((100_000, 224, False), 1, 64 * GIB, "auto", "memory"),
        ((100_000, 224, False), 5, 64 * GIB, "auto", "disk"),  # every process of the worker holds a copy
        ((100_000, 224, False), 5, None, "memory", "memory"),  # no known limit: nothing to refuse
        ((1_000, 32, False), 1, 64 * GIB, "disk", "disk"),  # asked for
    ],
)
def test_a_data_set_is_held_in_memory_when_every_process_copy_fits_the_workers_memory_else_on_disk(
    data: tuple[int, int, bool], processes: int, limit: int | None, cache: str, held: str | None
) -> None:
    images, image_size, augment = data
    budget = memory.DataBudget(limit, processes, image_size, augment, baseline_bytes=500 << 20)
    if held is None:
        with pytest.raises(DataError, match=r"ImageFolder /data: \d+ images .* GiB"):
            budget.choose(images, "ImageFolder /data", cache, streamable=True)
    else:
        assert budget.choose(images, "ImageFolder /data", cache, streamable=True) == held


@pytest.mark.unit
def test_a_set_that_cannot_be_streamed_is_refused_when_it_does_not_fit_memory() -> None:
    """FakeData and torchvision's CIFAR-10 are held in memory only: auto cannot move them to disk."""
    budget = memory.DataBudget(GIB, 1, 224, False)
    with pytest.raises(DataError, match=r"FakeData: 100000 images of 3x224x224 .* data\.image_size"):
        budget.choose(100_000, "FakeData", "auto", streamable=False)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"memory.max": "2147483648\n"}, 2 * GIB),
        ({"memory.max": "max\n"}, 8 * GIB),
        ({"memory/memory.limit_in_bytes": "1073741824\n"}, GIB),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 8 * GIB),
        ({}, 8 * GIB),
    ],
    ids=["v2-limit", "v2-unlimited", "v1-limit", "v1-unlimited", "no-cgroup"],
)
def test_the_memory_limit_is_the_containers_else_the_machines(
    tmp_path: Path, files: dict[str, str], expected: int
) -> None:
    for name, text in files.items():
        (tmp_path / "cgroup" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cgroup" / name).write_text(text)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        8388608 kB\nMemAvailable:    4000000 kB\n")
    assert memory.memory_limit_bytes(tmp_path / "cgroup", meminfo) == expected


@pytest.mark.unit
def test_a_data_set_too_big_for_memory_exits_3_before_decoding(tmp_path: Path) -> None:
    config = {
        "model": "resnet_small",
        "output_dir": str(tmp_path),
        "data": {"dataset": "fake", "fake_size": 1_000_000, "image_size": 512},
    }
    result = kubetrain("train", env=trainer_env(config), timeout=90)
    assert result.returncode == ExitCode.DATA_ERROR, result.stderr
    assert "1000000 images of 3x512x512" in result.stderr and "data.image_size" in result.stderr
