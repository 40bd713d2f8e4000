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

from kubetrain_trainer import memory
from kubetrain_trainer.datasets import LabeledImages
from kubetrain_trainer.failures import ConfigError
from kubetrain_trainer.preprocessing import Preprocessing

if TYPE_CHECKING:
    from concurrent.futures import Future

    import torch

CROP_PADDING = 4
"""Default reflect padding of random crops, in pixels: crops shift the image by up to this much."""


def pad_reflect(images: torch.Tensor, padding: int = CROP_PADDING, chunk: int | None = None) -> torch.Tensor:
    """Reflect-pad a uint8 NCHW tensor once, chunk by chunk into the result (reflect padding needs a float
    copy; chunks of `memory.WORK_ELEMENTS` by default bound it, and no second copy of the result is made).

    Padding the whole dataset up front turns every later random crop into a single gather. The result is
    channels_last (each pixel's channels adjacent), so a crop gathers whole pixels.
    """
    import torch
    from torch.nn import functional

    n, channels, height, width = images.shape
    chunk = chunk or memory.work_images(channels * height * width)
    padded = torch.empty(
        (n, channels, height + 2 * padding, width + 2 * padding),
        dtype=torch.uint8,
        device=images.device,
        memory_format=torch.channels_last,
    )
    for i in range(0, n, chunk):
        part = images[i : i + chunk].float()
        padded[i : i + chunk] = functional.pad(part, (padding,) * 4, mode="reflect").to(torch.uint8)
    return padded


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


DEVICE_SHARE = 0.5
"""A data set is copied onto a GPU only when it and its padded copy take at most this share of the memory
free there: the rest is the model's, its activations' and cuDNN's workspaces'."""


def fits_on_device(needed_bytes: int, free_bytes: int) -> bool:
    """Whether a device copy of `needed_bytes` leaves the training its share of `free_bytes`."""
    return needed_bytes <= DEVICE_SHARE * free_bytes


class BatchLoader:
    """Yields (normalised float images, labels) for one rank; `set_epoch` selects the epoch and offset.

    Resident (`resident=True`): the set (and its padded copy, with augment) is held on `device`, where every
    batch is gathered: the in-memory path, and on a GPU the copy made when it fits. Streamed: the set stays
    where it is (mapped from the decoded cache, or in host memory beside a GPU too small for it); each batch
    is gathered there, padded, pinned when `device` is a GPU, and copied over, the next one prepared by a
    thread while the current one trains. Either way a batch's images, crops and flips are the same.
    """

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
        resident: bool = True,
    ) -> None:
        import torch

        global_batch = batch_size * world_size
        if len(data) < global_batch:
            raise ConfigError(
                f"training set has {len(data)} images, fewer than one global batch: batch_size({batch_size}) "
                f"* WORLD_SIZE({world_size}) = {global_batch}"
            )
        self.resident = resident
        self.home = device if resident else data.images.device
        """Where the set is held and batches are gathered."""
        self.data = LabeledImages(data.images.to(self.home), data.labels.to(self.home), data.classes)
        self.image_size = int(data.images.shape[-1])
        self.crop_padding = crop_padding
        self.padded = pad_reflect(self.data.images, crop_padding) if augment and resident else None
        self.flip = flip
        # Alternating flip: image i is mirrored in every other epoch, starting from a seeded coin toss, so
        # consecutive epochs always show both orientations (random flips repeat one about half the time).
        self.first_flip = torch.randint(
            0, 2, (len(data),), generator=torch.Generator().manual_seed(seed), dtype=torch.bool
        ).to(self.home)
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

    def _indices(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(step, dataset rows of this rank's batch) for the selected epoch's remaining steps."""
        import torch

        order_gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.data), generator=order_gen).to(self.home)
        global_batch = self.batch_size * self.world_size
        for step in range(self.start_step, len(self)):
            start = step * global_batch + self.rank * self.batch_size
            yield step, order[start : start + self.batch_size]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.resident:
            for step, index in self._indices():
                source = self.data.images[index] if self.padded is None else self.padded
                yield self._batch(step, index, source, self.data.labels[index], rows=index)
        else:
            yield from self._streamed()

    def _streamed(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches gathered where the set lives, one prepared ahead by a thread (gathering from mapped pages
        may wait for the disk; torch's gather and padding release the GIL while the step computes)."""
        from concurrent.futures import ThreadPoolExecutor

        indices = self._indices()
        with ThreadPoolExecutor(1, thread_name_prefix="batch-prefetch") as prefetch:
            ahead: list[tuple[int, torch.Tensor, Future[tuple[torch.Tensor, torch.Tensor]]]] = []
            for step, index in indices:
                ahead.append((step, index, prefetch.submit(self._gather, index)))
                if len(ahead) > 1:
                    yield self._arrive(*ahead.pop(0))
            while ahead:
                yield self._arrive(*ahead.pop(0))

    def _gather(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch's images (reflect-padded with augment) and labels, pinned for an asynchronous copy to a
        GPU."""
        images, labels = self.data.images[index], self.data.labels[index]
        if self.augment:
            images = pad_reflect(images, self.crop_padding)
        if self.device.type == "cuda":
            images, labels = images.pin_memory(), labels.pin_memory()
        return images, labels

    def _arrive(
        self, step: int, index: torch.Tensor, gathered: Future[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        images, labels = (part.to(self.device, non_blocking=True) for part in gathered.result())
        return self._batch(step, index, images, labels, rows=torch.arange(len(index), device=self.device))

    def _batch(
        self,
        step: int,
        index: torch.Tensor,
        source: torch.Tensor,
        labels: torch.Tensor,
        *,
        rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of dataset rows `index` at `step`. With augment, `source` holds padded images and the
        batch is cropped and flipped out of its `rows` by the batch's own generator; else `source` is the
        batch."""
        import torch

        images = source
        if self.augment:
            aug_gen = torch.Generator(device=self.device)
            aug_gen.manual_seed(batch_seed(self.seed, self.epoch, step, self.rank))
            images = crop(source, rows, self.image_size, self._flips(index, aug_gen), aug_gen)
        return self._finish(images), labels

    def _flips(self, index: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Which images of the batch `index` to mirror this epoch (see `flip`)."""
        import torch

        if self.flip == "alternating":
            return (self.first_flip[index] ^ bool(self.epoch % 2)).to(self.device)
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
