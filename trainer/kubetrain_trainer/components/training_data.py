"""This rank's data: the decoded set split into training and validation, the preprocessing fitted to the
training part, the batch loader and this rank's validation shard.

Nothing here is checkpointed: the split depends only on the files, and every batch of the loader is a
function of (seed, epoch, step, rank) (`batches`), so the progress counters alone say where it stands.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kubetrain_trainer import batches, datasets, distributed, memory
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.datasets import DataOrigin, LabeledImages
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.preprocessing import Preprocessing, fit_preprocessing

WHITENING_IMAGES = 5000
"""At most this many training images fit the whitening filters: their 12x12 patch covariance is already
stable, and more would only lengthen start-up."""


@dataclass
class TrainingData:
    """The data one rank trains and validates on; every rank holds the same split and preprocessing."""

    train: LabeledImages
    validation: LabeledImages
    validation_shard: LabeledImages
    """Every `world_size`-th validation image from this rank's: the ranks' confusion matrices and loss sums
    add up to the whole validation split's."""
    classes: list[str]
    origin: DataOrigin | None
    preprocessing: Preprocessing
    loader: batches.BatchLoader

    @property
    def global_batch(self) -> int:
        """Images per optimizer step over all ranks: what a checkpoint's mid-epoch position is counted in."""
        return self.loader.batch_size * self.loader.world_size

    def whitening_sample(self) -> torch.Tensor:
        """Evenly spaced normalised training images, the same on every rank so the replicas' filters match."""
        images = self.train.images
        chosen = images[:: max(1, len(images) // WHITENING_IMAGES)][:WHITENING_IMAGES]
        return self.preprocessing.normalize(chosen)


def load_training_data(config: TrainerConfig, world: WorldEnv, device: torch.device) -> TrainingData:
    """Decode (or read the cache of) the configured set within this worker's memory, split it and build the
    loader; the same on every rank.

    CIFAR-10 may be downloaded (torchvision writes the archive and extracts it in place, so ranks
    downloading into one root at once tear each other's files): it is loaded in turns, rank 0 first
    (`distributed.in_turns`, barriers: every rank calls this at the same point). Other data is read by
    every rank at once, with no collective."""
    budget = memory.DataBudget(
        memory.memory_limit_bytes(), world.local_world_size, config.data.image_size, config.augment
    )

    def load() -> datasets.LabeledImages:
        return datasets.load(config.data, config.seed, budget)

    full = distributed.in_turns(world, load) if config.data.dataset == "cifar10" else load()
    train, validation = datasets.split_validation(full, config.data.validation_fraction)
    preprocessing = fit_preprocessing(train.images, config.data.image_size)
    loader = batches.BatchLoader(
        train,
        preprocessing,
        batch_size=world.per_rank_batch(config.batch_size),
        rank=world.rank,
        world_size=world.world_size,
        seed=config.seed,
        augment=config.augment,
        device=device,
        crop_padding=config.crop_padding,
        flip=config.flip,
    )
    shard = validation.subset(torch.arange(world.rank, len(validation), world.world_size))
    return TrainingData(train, validation, shard, full.classes, full.origin, preprocessing, loader)
