"""The in-memory input path: rank splits, per-epoch shuffles, batch augmentation and the validation split."""

from __future__ import annotations

import pytest
import torch
from kubetrain_trainer import batches, datasets
from kubetrain_trainer.failures import ConfigError
from kubetrain_trainer.preprocessing import Preprocessing

pytestmark = pytest.mark.unit

IDENTITY = Preprocessing(4, (0.0, 0.0, 0.0), (1 / 255, 1 / 255, 1 / 255))
"""Normalisation that maps uint8 values to the same float values, so batches can be traced back."""


def _dataset(n: int = 24) -> datasets.LabeledImages:
    # Image i is filled with the value i, so a batch reveals which images it holds.
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 3, 4, 4).contiguous()
    return datasets.LabeledImages(images, torch.arange(n) % 3, ["a", "b", "c"])


def _ids(loader: batches.BatchLoader) -> list[list[int]]:
    return [images[:, 0, 0, 0].long().tolist() for images, _ in loader]


def _loader(rank: int, world: int, batch: int, seed: int = 7) -> batches.BatchLoader:
    return batches.BatchLoader(
        _dataset(),
        IDENTITY,
        batch_size=batch,
        rank=rank,
        world_size=world,
        seed=seed,
        augment=False,
        device=torch.device("cpu"),
    )


def test_two_ranks_of_batch_b_see_exactly_one_rank_of_batch_2b() -> None:
    single = _ids(_loader(0, 1, 8))
    rank0, rank1 = _ids(_loader(0, 2, 4)), _ids(_loader(1, 2, 4))
    assert len(single) == len(rank0) == len(rank1) == 3
    for whole, part0, part1 in zip(single, rank0, rank1, strict=True):
        assert whole == part0 + part1


def test_each_epoch_reshuffles_deterministically() -> None:
    loader = _loader(0, 1, 8)
    loader.set_epoch(1)
    first = _ids(loader)
    loader.set_epoch(2)
    second = _ids(loader)
    loader.set_epoch(1)
    assert first != second
    assert _ids(loader) == first
    assert sorted(i for batch in first for i in batch) == list(range(24))


def test_fewer_images_than_one_global_batch_names_the_factors() -> None:
    with pytest.raises(ConfigError, match=r"batch_size\(16\) \* WORLD_SIZE\(2\) = 32"):
        _loader(0, 2, 16)


def test_crop_flip_returns_shifted_or_mirrored_windows_of_the_reflect_padded_image() -> None:
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, 3, 8, 8), dtype=torch.uint8)
    padded = batches.pad_reflect(images, padding=2, chunk=10)
    assert torch.equal(
        padded, torch.nn.functional.pad(images.float(), (2,) * 4, mode="reflect").to(torch.uint8)
    )
    out = batches.crop_flip(padded, 8, gen)
    assert out.shape == images.shape and out.dtype == torch.uint8
    assert out.is_contiguous(memory_format=torch.channels_last)
    offsets = set()
    for i in range(len(images)):
        matches = [
            (y, x, flip)
            for y in range(5)
            for x in range(5)
            for flip in (False, True)
            if torch.equal(
                out[i],
                padded[i, :, y : y + 8, x : x + 8].flip(-1) if flip else padded[i, :, y : y + 8, x : x + 8],
            )
        ]
        assert matches, f"image {i} is not a window of its padded original"
        offsets.update(matches)
    assert len(offsets) > 10  # offsets and flips really vary across the batch


def test_validation_split_takes_the_tail_of_every_class() -> None:
    data = _dataset(30)  # labels cycle 0,1,2: ten images per class
    train, val = datasets.split_validation(data, 0.2)
    assert len(train) == 24 and len(val) == 6
    assert sorted(val.images[:, 0, 0, 0].tolist()) == [24, 25, 26, 27, 28, 29]
    assert torch.bincount(val.labels).tolist() == [2, 2, 2]
