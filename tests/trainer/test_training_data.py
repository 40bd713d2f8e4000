"""Every rank holds the same split, preprocessing and whitening sample; the ranks' validation shards
partition the validation split, and the global batch is what a checkpoint's position is counted in."""

from __future__ import annotations

import pytest
import torch
from kubetrain_trainer import batches, datasets
from kubetrain_trainer.components.training_data import WHITENING_BYTES, TrainingData, load_training_data
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv

pytestmark = pytest.mark.unit

CONFIG = TrainerConfig(batch_size=8, data={"dataset": "fake", "fake_size": 96, "validation_fraction": 0.25})


def _rank(rank: int, world_size: int = 2) -> TrainingData:
    return load_training_data(CONFIG, WorldEnv(rank=rank, world_size=world_size), torch.device("cpu"))


def test_the_ranks_validation_shards_partition_the_validation_split() -> None:
    first, second = _rank(0), _rank(1)
    assert torch.equal(first.validation.images, second.validation.images)
    shards = torch.cat([first.validation_shard.labels, second.validation_shard.labels])
    assert len(shards) == len(first.validation)
    assert torch.equal(first.validation_shard.images, first.validation.images[0::2])
    assert torch.equal(second.validation_shard.images, first.validation.images[1::2])


def test_every_rank_fits_the_same_preprocessing_and_whitening_sample() -> None:
    first, second = _rank(0), _rank(1)
    assert first.preprocessing == second.preprocessing
    assert torch.equal(first.whitening_sample(), second.whitening_sample())


def test_the_global_batch_is_every_ranks_batch_together() -> None:
    assert _rank(0).global_batch == 16
    assert _rank(0, world_size=1).global_batch == 8


def test_the_whitening_sample_of_large_images_stays_within_its_memory_bound() -> None:
    """5,000 normalised images of 128 px are 938 MiB of floats, as much as a 1 GiB worker streaming its set
    from disk has in all; the sample takes fewer of them instead (32-px sets keep their 5,000)."""
    images = torch.zeros(1, 3, 128, 128, dtype=torch.uint8).expand(6000, 3, 128, 128)
    train = datasets.LabeledImages(images, torch.zeros(6000, dtype=torch.int64), ["a"])
    data = _rank(0, world_size=1)
    loader = batches.BatchLoader(
        train,
        data.preprocessing,
        batch_size=8,
        rank=0,
        world_size=1,
        seed=0,
        augment=False,
        device=torch.device("cpu"),
    )
    large = TrainingData(train, train, train, ["a"], None, data.preprocessing, loader)
    sample = large.whitening_sample()
    assert len(sample) >= 300 and sample.numel() * 4 <= WHITENING_BYTES
    assert len(data.whitening_sample()) == len(data.train)  # a small 32-px set: all of it
