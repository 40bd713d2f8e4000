"""This rank's data: the decoded set split into training and validation, the preprocessing fitted to the
training part, the batch loader and this rank's validation shard.

Nothing here is checkpointed: the split depends only on the files, and every batch of the loader is a
function of (seed, epoch, step, rank) (`batches`), so the progress counters alone say where it stands.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from kubetrain_trainer import batches, datasets, distributed, memory
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.datasets import DataOrigin, LabeledImages
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.preprocessing import Preprocessing, fit_preprocessing

log = logging.getLogger(__name__)

WHITENING_IMAGES = 5000
"""At most this many training images fit the whitening filters: their 12x12 patch covariance is already
stable, and more would only lengthen start-up."""
WHITENING_BYTES = 64 << 20
"""And at most this much of them as normalised floats: 5,000 images of 32 px take 59 MiB, but of 128 px
they would take 938 MiB, nearly all that a 1 GiB worker streaming its set from disk has; 341 such images still
give 5.5 million patches."""


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
        count = min(WHITENING_IMAGES, max(1, WHITENING_BYTES // (4 * images[0].numel())))
        chosen = images[:: max(1, len(images) // count)][:count]
        return self.preprocessing.normalize(chosen)


def data_budget(config: TrainerConfig, world: WorldEnv) -> memory.DataBudget:
    """This worker's memory limit and this process's memory now, with how the configured data will be held:
    what `data.cache` auto decides by.

    FakeData and torchvision's CIFAR-10 are read through torchvision, whose import alone takes ~160 MiB:
    it is imported before the process's memory is read, so that the baseline counts it."""
    data = config.data
    if data.dataset == "fake" or (data.dataset == "cifar10" and not (Path(data.root) / "train").is_dir()):
        importlib.import_module("torchvision")
    return memory.DataBudget(
        memory.memory_limit_bytes(),
        world.local_world_size,
        config.data.image_size,
        config.augment,
        crop_padding=config.crop_padding,
        validation_fraction=config.data.validation_fraction,
        batch_size=world.per_rank_batch(config.batch_size),
        baseline_bytes=memory.resident_bytes(),
    )


def holds_resident(device: torch.device, mapped: bool, needed_bytes: int, free_bytes: int) -> bool:
    """Whether the loader holds the training set (and its padded copy) on `device`, else streams batches
    to it: on the CPU when the set is in memory (a mapped set stays mapped); on a GPU when the copy of
    `needed_bytes` fits the `free_bytes` there (`batches.fits_on_device`), whatever the host holds."""
    if device.type == "cpu":
        return not mapped
    return batches.fits_on_device(needed_bytes, free_bytes)


def _writes_shared_files(config: TrainerConfig) -> bool:
    """Whether loading may write files other ranks read: CIFAR-10's download, the decoded cache."""
    data = config.data
    return data.dataset == "cifar10" or (
        data.dataset == "imagefolder" and (data.cache_decoded or data.cache != "memory")
    )


def load_training_data(config: TrainerConfig, world: WorldEnv, device: torch.device) -> TrainingData:
    """Decode (or read the decoded cache of) the configured set, held as `data.cache` and the worker's
    memory say, split it and build the loader; the same on every rank.

    Loading that writes shared files is done in turns (`distributed.in_turns`, barriers: every rank calls
    this at the same point): CIFAR-10 may be downloaded (torchvision writes the archive and extracts it in
    place, so ranks downloading into one root at once tear each other's files) and the decoded cache is
    written once per node, by rank 0 and then each worker's LOCAL_RANK 0, while the others wait and then
    find it current. Other data is read by every rank at once, with no collective."""
    budget = data_budget(config, world)

    def load() -> datasets.SplitData:
        return datasets.load(config.data, config.seed, budget)

    split = distributed.in_turns(world, load) if _writes_shared_files(config) else load()
    train, validation = split.train, split.validation
    preprocessing = fit_preprocessing(train.images, config.data.image_size)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0
    resident = holds_resident(device, split.mapped, budget.device_copy_bytes(len(train)), free)
    if world.is_main:
        log.info(
            "training images %s, batches %s",
            "memory-mapped from the decoded cache on disk" if split.mapped else "in memory",
            f"gathered on {device}" if resident else f"streamed to {device} with one prefetched",
        )
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
        resident=resident,
    )
    step = world.world_size
    shard = LabeledImages(
        validation.images[world.rank :: step], validation.labels[world.rank :: step], split.classes
    )
    return TrainingData(train, validation, shard, split.classes, split.origin, preprocessing, loader)
