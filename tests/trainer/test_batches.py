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


def test_crop_returns_shifted_or_mirrored_windows_of_the_reflect_padded_image() -> None:
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, 3, 8, 8), dtype=torch.uint8)
    padded = batches.pad_reflect(images, padding=2, chunk=10)
    assert torch.equal(
        padded, torch.nn.functional.pad(images.float(), (2,) * 4, mode="reflect").to(torch.uint8)
    )
    index = torch.tensor([5, 0, 63, 5])
    flip = torch.tensor([True, False, True, False])
    out = batches.crop(padded, index.repeat(16), 8, flip.repeat(16), gen)
    assert out.shape == (64, 3, 8, 8) and out.dtype == torch.uint8
    assert out.is_contiguous(memory_format=torch.channels_last)
    offsets = set()
    for i, (source, mirrored) in enumerate(
        zip(index.repeat(16).tolist(), flip.repeat(16).tolist(), strict=True)
    ):
        matches = [
            (y, x)
            for y in range(5)
            for x in range(5)
            if torch.equal(
                out[i],
                padded[source, :, y : y + 8, x : x + 8].flip(-1)
                if mirrored
                else padded[source, :, y : y + 8, x : x + 8],
            )
        ]
        assert matches, f"crop {i} is not a window of padded image {source} (mirrored: {mirrored})"
        offsets.update(matches)
    assert len(offsets) > 10  # offsets really vary across the batch


def _flip_loader(flip: str) -> batches.BatchLoader:
    # Image i holds the value i in its left column and 255 elsewhere, so a batch shows which images were
    # mirrored (no padding: the crops are the images themselves).
    n = 24
    images = torch.full((n, 3, 4, 4), 255, dtype=torch.uint8)
    images[:, :, :, 0] = torch.arange(n, dtype=torch.uint8).view(n, 1, 1)
    data = datasets.LabeledImages(images, torch.arange(n) % 3, ["a", "b", "c"])
    return batches.BatchLoader(
        data,
        IDENTITY,
        batch_size=8,
        rank=0,
        world_size=1,
        seed=3,
        augment=True,
        device=torch.device("cpu"),
        crop_padding=0,
        flip=flip,
    )


def _mirrored_images(loader: batches.BatchLoader, epoch: int) -> set[int]:
    loader.set_epoch(epoch)
    mirrored = set()
    for images, _ in loader:
        for image in images:
            if image[0, 0, 3] != 255:  # the value column moved to the right edge
                mirrored.add(int(image[0, 0, 3]))
    return mirrored


def test_alternating_flip_mirrors_each_image_in_every_other_epoch() -> None:
    loader = _flip_loader("alternating")
    epochs = [_mirrored_images(loader, epoch) for epoch in range(4)]
    everyone = set(range(24))
    assert 0 < len(epochs[0]) < 24
    assert epochs[1] == everyone - epochs[0] and epochs[2] == epochs[0] and epochs[3] == epochs[1]


def test_random_flip_draws_afresh_each_epoch() -> None:
    loader = _flip_loader("random")
    first, second = _mirrored_images(loader, 0), _mirrored_images(loader, 1)
    assert first != second and second != set(range(24)) - first


def test_validation_split_takes_the_tail_of_every_class() -> None:
    data = _dataset(30)  # labels cycle 0,1,2: ten images per class
    train, val = datasets.split_validation(data, 0.2)
    assert len(train) == 24 and len(val) == 6
    assert sorted(val.images[:, 0, 0, 0].tolist()) == [24, 25, 26, 27, 28, 29]
    assert torch.bincount(val.labels).tolist() == [2, 2, 2]
