"""Batches from in-memory uint8 tensors: per-rank index split, batch-level augmentation, normalisation.

Equivalent to DistributedSampler + DataLoader without per-sample Python work: every rank draws the same
seeded permutation for the epoch, cuts it into global batches, and takes its own slice of each, so
`world_size` ranks x batch b see exactly the images that 1 rank x batch (world_size x b) would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from kubetrain_trainer.datasets import LabeledImages
from kubetrain_trainer.failures import ConfigError
from kubetrain_trainer.preprocessing import Preprocessing

if TYPE_CHECKING:
    import torch

CROP_PADDING = 4


def random_crop_flip(
    images: torch.Tensor, generator: torch.Generator, padding: int = CROP_PADDING
) -> torch.Tensor:
    """Random crop (reflect padding) and horizontal flip of a whole uint8 NCHW batch in a few tensor ops.

    One gather picks each image's shifted window, so cost does not grow with the number of distinct
    offsets; the result comes back channels_last, the layout the convolutions want anyway.
    """
    import torch
    from torch.nn import functional

    n, _, h, w = images.shape
    padded = functional.pad(images.float(), (padding,) * 4, mode="reflect").to(images.dtype)
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=images.device)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=images.device)
    flip = torch.rand(n, generator=generator, device=images.device) < 0.5
    cols = torch.arange(w, device=images.device)
    cols = torch.where(flip[:, None], w - 1 - cols, cols)
    rows = dy[:, None] + torch.arange(h, device=images.device)
    cols = dx[:, None] + cols
    batch = torch.arange(n, device=images.device)
    # Advanced indices split by a slice put the indexed dims first: the result is N, H, W, C.
    picked = padded[batch[:, None, None], :, rows[:, :, None], cols[:, None, :]]
    return picked.permute(0, 3, 1, 2)


class BatchLoader:
    """Yields (normalised float images, labels) for one rank; `set_epoch` reshuffles per epoch."""

    def __init__(
        self,
        data: LabeledImages,
        preprocessing: Preprocessing,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        augment: bool,
        device: torch.device,
        channels_last: bool = True,
    ) -> None:
        global_batch = batch_size * world_size
        if len(data) < global_batch:
            raise ConfigError(
                f"training set has {len(data)} images, fewer than one global batch: batch_size({batch_size}) "
                f"* WORLD_SIZE({world_size}) = {global_batch}"
            )
        self.data = LabeledImages(data.images.to(device), data.labels.to(device), data.classes)
        self.preprocessing = preprocessing
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.augment = augment
        self.device = device
        self.channels_last = channels_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation and augmentation draws the next iteration uses."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Batches per epoch; the incomplete last global batch is dropped so ranks stay in lockstep."""
        return len(self.data) // (self.batch_size * self.world_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        import torch

        order_gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.data), generator=order_gen).to(self.device)
        aug_gen = torch.Generator(device=self.device).manual_seed(
            (self.seed * 1_000_003 + self.epoch) * 4099 + self.rank + 1
        )
        global_batch = self.batch_size * self.world_size
        for step in range(len(self)):
            start = step * global_batch + self.rank * self.batch_size
            index = order[start : start + self.batch_size]
            images = self.data.images[index]
            if self.augment:
                images = random_crop_flip(images, aug_gen)
            yield self._finish(images), self.data.labels[index]

    def _finish(self, images: torch.Tensor) -> torch.Tensor:
        import torch

        images = self.preprocessing.normalize(images)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images


def eval_batches(
    data: LabeledImages,
    preprocessing: Preprocessing,
    batch_size: int,
    device: torch.device,
    channels_last: bool = True,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """All of `data` in order, normalised, without augmentation (evaluation and predict)."""
    import torch

    for start in range(0, len(data), batch_size):
        images = preprocessing.normalize(data.images[start : start + batch_size].to(device))
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        yield images, data.labels[start : start + batch_size].to(device)
