"""Batches from in-memory uint8 tensors: per-rank index split, batch-level augmentation, normalisation.

Equivalent to DistributedSampler + DataLoader without per-sample Python work: every rank draws the same
seeded permutation for the epoch, cuts it into global batches, and takes its own slice of each, so
`world_size` ranks x batch b see exactly the images that 1 rank x batch (world_size x b) would.

Every batch is a pure function of (seed, epoch, step, rank): the permutation of the epoch and a generator
seeded for that one batch. A run resumed in the middle of an epoch therefore continues with exactly the
batches and augmentations the interrupted run would have drawn, with no random state to checkpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kubetrain_trainer.datasets import LabeledImages
from kubetrain_trainer.failures import ConfigError
from kubetrain_trainer.preprocessing import Preprocessing

if TYPE_CHECKING:
    import torch

CROP_PADDING = 4
"""Default reflect padding of random crops, in pixels: crops shift the image by up to this much."""


def pad_reflect(images: torch.Tensor, padding: int = CROP_PADDING, chunk: int = 4096) -> torch.Tensor:
    """Reflect-pad a uint8 NCHW tensor once (in chunks, to bound the float copy reflect padding needs).

    Padding the whole dataset up front turns every later random crop into a single gather. The result is
    channels_last (each pixel's channels adjacent), so a crop gathers whole pixels.
    """
    import torch
    from torch.nn import functional

    parts = [
        functional.pad(images[i : i + chunk].float(), (padding,) * 4, mode="reflect").to(torch.uint8)
        for i in range(0, len(images), chunk)
    ]
    return torch.cat(parts).contiguous(memory_format=torch.channels_last)


def crop(
    padded: torch.Tensor, index: torch.Tensor, size: int, flip: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """A random `size` x `size` window of each image `index` of a channels_last padded uint8 set, mirrored
    horizontally where `flip` is true.

    One `index_select` of whole pixels (rows of C bytes) from the flattened set picks every image's window,
    so neither the number of distinct offsets nor copying the padded images first costs anything; the
    result comes back channels_last, the layout the convolutions want anyway.
    """
    import torch

    _, channels, padded_h, padded_w = padded.shape
    device = padded.device
    n = len(index)
    dy = torch.randint(0, padded_h - size + 1, (n,), generator=generator, device=device)
    dx = torch.randint(0, padded_w - size + 1, (n,), generator=generator, device=device)
    steps = torch.arange(size, device=device)
    cols = dx[:, None] + torch.where(flip[:, None], size - 1 - steps, steps)
    rows = (index * padded_h + dy)[:, None] + steps
    pixels = (rows[:, :, None] * padded_w + cols[:, None, :]).view(-1)
    flat = padded.permute(0, 2, 3, 1).reshape(-1, channels)  # a view: padded is channels_last
    return flat.index_select(0, pixels).view(n, size, size, channels).permute(0, 3, 1, 2)


def batch_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    """The augmentation generator's seed for one batch: a hash, so any seed, epoch and step fit 63 bits."""
    text = f"kubetrain-augment:{seed}:{epoch}:{step}:{rank}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


class BatchLoader:
    """Yields (normalised float images, labels) for one rank; `set_epoch` selects the epoch and offset."""

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
        crop_padding: int = CROP_PADDING,
        flip: str = "random",
    ) -> None:
        import torch

        global_batch = batch_size * world_size
        if len(data) < global_batch:
            raise ConfigError(
                f"training set has {len(data)} images, fewer than one global batch: batch_size({batch_size}) "
                f"* WORLD_SIZE({world_size}) = {global_batch}"
            )
        self.data = LabeledImages(data.images.to(device), data.labels.to(device), data.classes)
        self.image_size = int(data.images.shape[-1])
        self.padded = pad_reflect(self.data.images, crop_padding) if augment else None
        self.flip = flip
        # Alternating flip: image i is mirrored in every other epoch, starting from a seeded coin toss, so
        # consecutive epochs always show both orientations (random flips repeat one about half the time).
        self.first_flip = torch.randint(
            0, 2, (len(data),), generator=torch.Generator().manual_seed(seed), dtype=torch.bool
        ).to(device)
        self.preprocessing = preprocessing
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.augment = augment
        self.device = device
        self.channels_last = channels_last
        self.epoch = 0
        self.start_step = 0

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Select the epoch the next iteration yields, from its batch `start_step` on (a resumed epoch)."""
        self.epoch = epoch
        self.start_step = start_step

    def __len__(self) -> int:
        """Batches per epoch; the incomplete last global batch is dropped so ranks stay in lockstep."""
        return len(self.data) // (self.batch_size * self.world_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        import torch

        order_gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.data), generator=order_gen).to(self.device)
        global_batch = self.batch_size * self.world_size
        for step in range(self.start_step, len(self)):
            start = step * global_batch + self.rank * self.batch_size
            index = order[start : start + self.batch_size]
            if self.padded is not None:
                aug_gen = torch.Generator(device=self.device)
                aug_gen.manual_seed(batch_seed(self.seed, self.epoch, step, self.rank))
                images = crop(self.padded, index, self.image_size, self._flips(index, aug_gen), aug_gen)
            else:
                images = self.data.images[index]
            yield self._finish(images), self.data.labels[index]

    def _flips(self, index: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Which images of the batch `index` to mirror this epoch (see `flip`)."""
        import torch

        if self.flip == "alternating":
            return self.first_flip[index] ^ bool(self.epoch % 2)
        return torch.rand(len(index), generator=generator, device=self.device) < 0.5

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
