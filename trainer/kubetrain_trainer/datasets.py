"""Data sources decoded once into uint8 tensors: ImageFolder trees, CIFAR-10 and FakeData.

Per-sample PIL work happens exactly once per dataset version: the decoded tensors are cached next to the
data (atomically, keyed by a fingerprint of the files), so restarts and later epochs only touch tensors.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubetrain_trainer import atomic, decoding, preprocessing
from kubetrain_trainer.config import DataConfig
from kubetrain_trainer.failures import DataError
from kubetrain_trainer.memory import DataBudget

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm"})
CACHE_DIR_NAME = ".kubetrain-cache"
_CACHE_FORMAT = 2


@dataclass(frozen=True)
class DataOrigin:
    """What a data set was read from, recorded in model.pt and metrics.json so results can be traced.

    `files_sha256` digests the list of inputs (relative path and label per image, or torchvision's file
    names and checksums), not their pixels: it tells which files were used without reading them again.
    """

    source: str
    files: int
    files_sha256: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def digest_lines(lines: Iterable[str]) -> str:
    """SHA-256 of `lines`, each ended by a newline (a file list in a stable text form)."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(f"{line}\n".encode())
    return digest.hexdigest()


@dataclass
class LabeledImages:
    """A decoded dataset: uint8 images (N, 3, S, S), int64 labels (N,), class names and, when loaded from
    a source (not cut from another set), where it came from."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    origin: DataOrigin | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: torch.Tensor) -> LabeledImages:
        """Rows `indices` of this dataset, same classes (a part has no origin of its own)."""
        return LabeledImages(self.images[indices], self.labels[indices], self.classes)


def split_validation(data: LabeledImages, fraction: float) -> tuple[LabeledImages, LabeledImages]:
    """Hold out the last `fraction` of every class (in file order): the same split on every rank and run.

    Taking the tail of each class keeps classes balanced in both parts and needs no random state.
    """
    import torch

    train_parts, val_parts = [], []
    for label in range(len(data.classes)):
        members = torch.nonzero(data.labels == label).flatten()
        n_val = round(len(members) * fraction)
        if fraction > 0 and len(members) > 1:
            n_val = max(1, n_val)
        train_parts.append(members[: len(members) - n_val])
        val_parts.append(members[len(members) - n_val :])
    train_idx = torch.cat(train_parts).sort().values
    val_idx = torch.cat(val_parts).sort().values
    return data.subset(train_idx), data.subset(val_idx)


def list_image_folder(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Classes (sorted subdirectory names) and (file, label) pairs in sorted order, like ImageFolder."""
    if not root.is_dir():
        raise DataError(f"data root {root} does not exist or is not a directory")
    classes = sorted(
        entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith(".")
    )
    samples: list[tuple[Path, int]] = []
    for label, name in enumerate(classes):
        files = sorted(
            path
            for path in (root / name).rglob("*")
            if path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file()
        )
        samples.extend((path, label) for path in files)
    if not samples:
        raise DataError(
            f"no images under {root}: expected an ImageFolder layout <root>/<class>/<image> "
            f"with extensions {', '.join(sorted(IMAGE_EXTENSIONS))}"
        )
    return classes, samples


def _fingerprint(samples: list[tuple[Path, int]], image_size: int) -> str:
    digest = hashlib.sha256(f"v{_CACHE_FORMAT}:{image_size}".encode())
    for path, label in samples:
        stat = path.stat()
        digest.update(f"{path.name}:{label}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def _decode_all(samples: list[tuple[Path, int]], image_size: int) -> torch.Tensor:
    """Decode every file (in parallel processes) into one uint8 NCHW tensor; a failure is a DataError."""
    import torch

    decoded = decoding.decode_files([path for path, _ in samples], image_size)
    return torch.from_numpy(decoded).permute(0, 3, 1, 2).contiguous()


def _load_cache(path: Path) -> LabeledImages | None:
    import torch

    try:
        blob = torch.load(path, weights_only=True)
        return LabeledImages(blob["images"], blob["labels"], list(blob["classes"]))
    except Exception as error:
        log.warning("ignoring unreadable decode cache %s: %s", path, error)
        return None


def _save_cache(path: Path, data: LabeledImages) -> None:
    import torch

    blob = {"images": data.images, "labels": data.labels, "classes": data.classes}
    try:
        atomic.write_atomic(path, lambda tmp: torch.save(blob, tmp))
    except OSError as error:  # read-only data volumes are normal: train without the cache
        log.info("not caching decoded images at %s: %s", path, error)


def load_image_folder(
    root: Path, image_size: int, cache: bool, budget: DataBudget | None = None
) -> LabeledImages:
    """Decode an ImageFolder tree once, reusing the cache in `<root>/../.kubetrain-cache/` when current.

    `budget`, when given, refuses a tree too big for the worker's memory before anything is decoded.
    """
    import torch

    classes, samples = list_image_folder(root)
    if budget is not None:
        budget.check(len(samples), f"ImageFolder {root}")
    origin = DataOrigin(
        f"imagefolder {root}",
        len(samples),
        digest_lines(f"{path.relative_to(root).as_posix()}\t{label}" for path, label in samples),
    )
    # Beside the tree, not in it: a hidden directory among the classes breaks other ImageFolder readers.
    cache_name = f"{root.name}-decoded-{image_size}px-{_fingerprint(samples, image_size)}.pt"
    cache_path = root.resolve().parent / CACHE_DIR_NAME / cache_name
    if cache and cache_path.is_file():
        cached = _load_cache(cache_path)
        if cached is not None and len(cached) == len(samples) and cached.classes == classes:
            log.info("loaded %d decoded images from cache %s", len(cached), cache_path)
            return LabeledImages(cached.images, cached.labels, classes, origin)
    log.info("decoding %d images in %d classes under %s", len(samples), len(classes), root)
    data = LabeledImages(
        _decode_all(samples, image_size),
        torch.tensor([label for _, label in samples], dtype=torch.int64),
        classes,
        origin,
    )
    if cache:
        _save_cache(cache_path, data)
    return data


def _load_torchvision_cifar10(root: Path, image_size: int, budget: DataBudget | None) -> LabeledImages:
    import torch
    import torchvision
    from PIL import Image

    try:
        dataset = torchvision.datasets.CIFAR10(str(root), train=True, download=True)
    except Exception as error:
        raise DataError(
            f"CIFAR-10 not found under {root} (neither an ImageFolder tree {root / 'train'} nor "
            f"torchvision's cifar-10-batches-py) and the download failed: {error}"
        ) from error
    if budget is not None:
        budget.check(len(dataset.data), f"CIFAR-10 under {root}")
    if image_size == 32:
        images = torch.from_numpy(dataset.data).permute(0, 3, 1, 2).contiguous()
    else:
        images = torch.stack(
            [preprocessing.pil_to_uint8(Image.fromarray(a), image_size) for a in dataset.data]
        )
    origin = DataOrigin(
        f"torchvision CIFAR10 train {root}",
        len(dataset.data),
        digest_lines(f"{name}\t{md5}" for name, md5 in dataset.train_list),
    )
    targets = torch.tensor(dataset.targets, dtype=torch.int64)
    return LabeledImages(images, targets, list(dataset.classes), origin)


def _load_fake(size: int, image_size: int, seed: int) -> LabeledImages:
    import torch
    import torchvision

    dataset = torchvision.datasets.FakeData(
        size=size, image_size=(3, image_size, image_size), random_offset=seed
    )
    images, labels = [], []
    for image, label in dataset:
        images.append(preprocessing.pil_to_uint8(image, image_size))
        labels.append(int(label))
    spec = f"FakeData size={size} image_size={image_size} random_offset={seed}"
    origin = DataOrigin(spec, size, digest_lines([spec]))
    return LabeledImages(torch.stack(images), torch.tensor(labels), [f"class{i}" for i in range(10)], origin)


def load(config: DataConfig, seed: int, budget: DataBudget | None = None) -> LabeledImages:
    """The whole labelled dataset selected by `config`, decoded into uint8 tensors on the CPU.

    With a `budget`, a data set that cannot fit the worker's memory is a DataError before decoding.
    """
    root = Path(config.root)
    if config.dataset == "fake":
        if budget is not None:
            budget.check(config.fake_size, "FakeData (data.fake_size)")
        return _load_fake(config.fake_size, config.image_size, seed)
    if config.dataset == "imagefolder":
        return load_image_folder(root, config.image_size, config.cache_decoded, budget)
    if (root / "train").is_dir():
        return load_image_folder(root / "train", config.image_size, config.cache_decoded, budget)
    return _load_torchvision_cifar10(root, config.image_size, budget)
