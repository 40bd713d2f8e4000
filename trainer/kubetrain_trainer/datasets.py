"""Data sources decoded once into uint8 tensors: ImageFolder trees, CIFAR-10 and FakeData.

Per-sample PIL work happens exactly once per dataset version: an ImageFolder tree is decoded into the
decoded cache file (`decoded_cache`, checked against a digest of the file listing), so restarts and later
epochs only touch tensors, read into memory or memory-mapped from that file (`data.cache`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kubetrain_trainer import decoded_cache, decoding, preprocessing
from kubetrain_trainer.config import DataConfig
from kubetrain_trainer.failures import ConfigError, DataError
from kubetrain_trainer.memory import DataBudget

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm"})
CACHE_DIR_NAME = ".kubetrain-cache"


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


def split_indices(labels: torch.Tensor, classes: int, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the training and validation parts, each in file order: the last `fraction` of every class
    is held out, the same on every rank and run.

    Taking the tail of each class keeps classes balanced in both parts and needs no random state.
    """
    import torch

    train_parts, val_parts = [], []
    for label in range(classes):
        members = torch.nonzero(labels == label).flatten()
        n_val = round(len(members) * fraction)
        if fraction > 0 and len(members) > 1:
            n_val = max(1, n_val)
        train_parts.append(members[: len(members) - n_val])
        val_parts.append(members[len(members) - n_val :])
    return torch.cat(train_parts).sort().values, torch.cat(val_parts).sort().values


def split_validation(data: LabeledImages, fraction: float) -> tuple[LabeledImages, LabeledImages]:
    """`data` cut by `split_indices` into copies of its training and validation parts."""
    train_idx, val_idx = split_indices(data.labels, len(data.classes), fraction)
    return data.subset(train_idx), data.subset(val_idx)


@dataclass
class SplitData:
    """A dataset loaded as its training and validation parts."""

    train: LabeledImages
    validation: LabeledImages
    classes: list[str]
    origin: DataOrigin | None
    mapped: bool
    """Memory-mapped from the decoded cache (streamed from disk), not held in this process's memory."""

    def whole(self) -> LabeledImages:
        """Both parts as one set (training rows first), for evaluating on all images."""
        import torch

        images = torch.cat([self.train.images, self.validation.images])
        return LabeledImages(images, torch.cat([self.train.labels, self.validation.labels]), self.classes)


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


def _fingerprint(root: Path, samples: list[tuple[Path, int]], image_size: int, fraction: float) -> str:
    """The listing rows are decoded from, in row order: paths, labels, sizes and modification times."""
    digest = hashlib.sha256(f"v{decoded_cache.FORMAT}:{image_size}:{fraction!r}".encode())
    for path, label in samples:
        stat = path.stat()
        digest.update(
            f"{path.relative_to(root).as_posix()}:{label}:{stat.st_size}:{stat.st_mtime_ns}\n".encode()
        )
    return digest.hexdigest()


def cache_path(root: Path, image_size: int, fraction: float, cache_dir: str = "") -> Path:
    """Where the decoded cache of the tree `root` lives: `cache_dir`, else `<root>/../.kubetrain-cache/`
    (beside the tree, not in it: a hidden directory among the classes breaks other ImageFolder readers)."""
    directory = Path(cache_dir) if cache_dir else root.resolve().parent / CACHE_DIR_NAME
    return directory / f"{root.name}-{image_size}px-val{fraction:g}.images"


def load_image_folder_split(
    root: Path,
    image_size: int,
    *,
    validation_fraction: float = 0.0,
    cache: str = "memory",
    cache_decoded: bool = True,
    cache_dir: str = "",
    budget: DataBudget | None = None,
) -> SplitData:
    """An ImageFolder tree as its training and validation parts, decoded once into the decoded cache file
    in split order, so each part is a slice of it: read into memory, or memory-mapped when `cache` (or
    `budget`'s choice for auto) is disk. A current file (its header's digest of the listing matches) is
    reused; a stale one is rewritten. Without `cache_decoded`, or where the file cannot be written, the
    in-memory path decodes into memory; the disk path needs the file (DataError naming data.cache_dir).
    """
    import torch

    classes, samples = list_image_folder(root)
    source = f"ImageFolder {root}"
    mode = "disk" if cache == "disk" else "memory"
    if budget is not None:
        mode = budget.choose(len(samples), source, cache, streamable=True)
    origin = DataOrigin(
        f"imagefolder {root}",
        len(samples),
        digest_lines(f"{path.relative_to(root).as_posix()}\t{label}" for path, label in samples),
    )
    all_labels = torch.tensor([label for _, label in samples], dtype=torch.int64)
    train_idx, val_idx = split_indices(all_labels, len(classes), validation_fraction)
    rows = torch.cat([train_idx, val_idx]).tolist()
    ordered = [samples[i] for i in rows]
    header = decoded_cache.Header(
        count=len(ordered),
        train=len(train_idx),
        image_size=image_size,
        classes=tuple(classes),
        source_digest=_fingerprint(root, ordered, image_size, validation_fraction),
    )
    labels = all_labels[rows].numpy()
    path = cache_path(root, image_size, validation_fraction, cache_dir)
    written = mode == "disk" or cache_decoded
    if written and decoded_cache.read_header(path) == header:
        log.info("loading %d decoded images from cache %s (%s)", header.count, path, mode)
    elif written:
        log.info("decoding %d images in %d classes under %s into %s", header.count, len(classes), root, path)
        try:
            decoded_cache.write(
                path, header, labels, decoding.decode_stream([p for p, _ in ordered], image_size)
            )
        except OSError as error:  # read-only data volumes are normal: decode into memory instead
            if mode == "disk":
                raise DataError(
                    f"{source}: cannot write the decoded cache {path} that data.cache disk streams from "
                    f"({error}); set data.cache_dir to a writable directory on the node's disk"
                ) from error
            log.info("not caching decoded images at %s: %s", path, error)
            written = False
    if written:
        read = decoded_cache.open_mapped if mode == "disk" else decoded_cache.read_into_memory
        images, label_tensor = read(path, header)
    else:
        log.info("decoding %d images in %d classes under %s", header.count, len(classes), root)
        array = np.empty((header.count, image_size, image_size, 3), dtype=np.uint8)
        filled = 0
        for chunk in decoding.decode_stream([p for p, _ in ordered], image_size):
            array[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
        images, label_tensor = torch.from_numpy(array).permute(0, 3, 1, 2), torch.from_numpy(labels)
    cut = header.train
    return SplitData(
        LabeledImages(images[:cut], label_tensor[:cut], classes),
        LabeledImages(images[cut:], label_tensor[cut:], classes),
        classes,
        origin,
        mapped=mode == "disk",
    )


def load_image_folder(
    root: Path, image_size: int, cache: bool, budget: DataBudget | None = None
) -> LabeledImages:
    """A whole ImageFolder tree in file order, held in memory (`load_image_folder_split` with no
    validation part), its decoded cache reused or written when `cache`."""
    split = load_image_folder_split(root, image_size, cache_decoded=cache, budget=budget)
    return LabeledImages(split.train.images, split.train.labels, split.classes, split.origin)


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
        budget.choose(len(dataset.data), f"CIFAR-10 under {root}", "memory", streamable=False)
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


def _in_memory(full: LabeledImages, fraction: float) -> SplitData:
    train, validation = split_validation(full, fraction)
    return SplitData(train, validation, full.classes, full.origin, mapped=False)


def load(config: DataConfig, seed: int, budget: DataBudget | None = None) -> SplitData:
    """The labelled dataset selected by `config` as its training and validation parts, decoded into uint8
    tensors on the CPU, in memory or (ImageFolder trees, `data.cache`) memory-mapped from disk.

    With a `budget`, a data set that cannot fit the worker's memory either way is a DataError before
    decoding, and `data.cache: auto` picks the path by it.
    """
    root = Path(config.root)
    fraction = config.validation_fraction
    tree = root if config.dataset == "imagefolder" else root / "train"
    if config.dataset == "imagefolder" or (config.dataset == "cifar10" and tree.is_dir()):
        return load_image_folder_split(
            tree,
            config.image_size,
            validation_fraction=fraction,
            cache=config.cache,
            cache_decoded=config.cache_decoded,
            cache_dir=config.cache_dir,
            budget=budget,
        )
    if config.cache == "disk":
        raise ConfigError(
            f"data.cache disk streams ImageFolder trees only; data.dataset {config.dataset} under {root} "
            "is held in memory (data.cache auto or memory)"
        )
    if config.dataset == "fake":
        if budget is not None:
            budget.choose(config.fake_size, "FakeData (data.fake_size)", "memory", streamable=False)
        return _in_memory(_load_fake(config.fake_size, config.image_size, seed), fraction)
    return _in_memory(_load_torchvision_cifar10(root, config.image_size, budget), fraction)
