"""The decoded cache on disk and the batches streamed from it: one file of fixed-size uint8 images,
written atomically, rewritten when the listing changes, memory-mapped, and giving exactly the batches, crops,
flips and mid-epoch resume of the in-memory path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from kubetrain_trainer import batches, datasets, decoded_cache, memory
from kubetrain_trainer.components.training_data import holds_resident
from kubetrain_trainer.failures import DataError
from kubetrain_trainer.preprocessing import Preprocessing
from PIL import Image

pytestmark = pytest.mark.unit

PREPROCESSING = Preprocessing(32, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))


def _header(count: int = 6, size: int = 4) -> decoded_cache.Header:
    return decoded_cache.Header(count, count - 2, size, ("a", "b"), "listing-digest")


def _rows(count: int = 6, size: int = 4) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


def test_a_cache_file_gives_back_its_rows_and_labels_mapped_or_read_into_memory(tmp_path: Path) -> None:
    """Both readers see exactly what was written, as NCHW views of the NHWC rows (no copy made)."""
    header, rows, labels = _header(), _rows(), np.array([0, 1, 1, 0, 1, 0])
    path = tmp_path / "set.images"
    decoded_cache.write(path, header, labels, [rows[:4], rows[4:]])
    assert decoded_cache.read_header(path) == header
    expected = torch.from_numpy(rows).permute(0, 3, 1, 2)
    for read in (decoded_cache.open_mapped, decoded_cache.read_into_memory):
        images, read_labels = read(path, header)
        assert torch.equal(images, expected) and images.shape == (6, 3, 4, 4)
        assert read_labels.tolist() == labels.tolist() and read_labels.dtype == torch.int64
    assert path.stat().st_size == header.file_size and header.images_offset % decoded_cache.ALIGN == 0


def test_a_write_cut_short_leaves_no_file_behind(tmp_path: Path) -> None:
    """A writer that fails (here: one image short) leaves neither the file nor its temporary file, so no
    reader can map half a data set."""
    path = tmp_path / "set.images"
    with pytest.raises(ValueError, match="5 images written for 6 rows"):
        decoded_cache.write(path, _header(), np.zeros(6, dtype=np.int64), [_rows()[:5]])
    assert list(tmp_path.iterdir()) == []


def test_a_foreign_or_truncated_file_is_not_taken_for_a_cache(tmp_path: Path) -> None:
    path = tmp_path / "set.images"
    decoded_cache.write(path, _header(), np.zeros(6, dtype=np.int64), [_rows()])
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size - 1)
    assert decoded_cache.read_header(path) is None
    path.write_bytes(b"not a cache file at all")
    assert decoded_cache.read_header(path) is None
    assert decoded_cache.read_header(tmp_path / "missing.images") is None


def test_images_of_any_size_are_resized_to_the_configured_size_when_cached(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for label, sizes in enumerate([[(50, 70), (200, 120)], [(33, 33), (640, 480)]]):
        (root / f"c{label}").mkdir(parents=True)
        for index, size in enumerate(sizes):
            Image.new("RGB", size, (40 * label, 100, 200)).save(root / f"c{label}" / f"{index}.jpg")
    split = datasets.load_image_folder_split(root, 24, cache="disk", cache_dir=str(tmp_path / "cache"))
    assert split.mapped and split.train.images.shape == (4, 3, 24, 24)
    assert split.train.labels.tolist() == [0, 0, 1, 1]
    assert list((tmp_path / "cache").iterdir()) == [tmp_path / "cache" / "tree-24px-val0.images"]


def test_the_disk_path_needs_a_writable_cache_directory_and_names_the_field(
    small_root: Path, tmp_path: Path
) -> None:
    blocked = tmp_path / "file-not-directory"
    blocked.write_text("")
    with pytest.raises(DataError, match=r"data\.cache_dir"):
        datasets.load_image_folder_split(small_root, 32, cache="disk", cache_dir=str(blocked / "cache"))


def _loader(data: datasets.LabeledImages, *, resident: bool, flip: str) -> batches.BatchLoader:
    return batches.BatchLoader(
        data,
        PREPROCESSING,
        batch_size=16,
        rank=1,
        world_size=2,
        seed=11,
        augment=True,
        device=torch.device("cpu"),
        crop_padding=2,
        flip=flip,
        resident=resident,
    )


def _epoch(loader: batches.BatchLoader, epoch: int, start_step: int = 0) -> list[torch.Tensor]:
    loader.set_epoch(epoch, start_step)
    return [torch.cat([images.flatten(), labels.float()]) for images, labels in loader]


@pytest.mark.parametrize("flip", ["random", "alternating"])
def test_batches_streamed_from_disk_are_those_of_the_memory_path_and_resume_mid_epoch_alike(
    small_root: Path, tmp_path: Path, flip: str
) -> None:
    """The same split, order, crops and flips, batch for batch over two epochs, and an epoch resumed at
    step 3 continues with exactly the uninterrupted epoch's batches: the disk path changes where images
    are read, not what is trained on, so a run may resume on the other path."""
    in_memory = datasets.load_image_folder_split(small_root, 32, validation_fraction=0.1, cache="memory")
    on_disk = datasets.load_image_folder_split(
        small_root, 32, validation_fraction=0.1, cache="disk", cache_dir=str(tmp_path / "cache")
    )
    assert not in_memory.mapped and on_disk.mapped
    assert torch.equal(in_memory.validation.images, on_disk.validation.images)
    resident = _loader(in_memory.train, resident=True, flip=flip)
    streamed = _loader(on_disk.train, resident=False, flip=flip)
    assert streamed.padded is None, "the disk path pads each batch, it holds no padded copy"
    for epoch in (1, 2):
        expected = _epoch(resident, epoch)
        got = _epoch(streamed, epoch)
        assert len(got) == len(expected) == 360 // 32
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
        resumed = _epoch(streamed, epoch, start_step=3)
        assert all(torch.equal(a, b) for a, b in zip(resumed, expected[3:], strict=True))


def test_the_in_memory_split_is_the_one_held_out_from_the_tail_of_every_class(small_root: Path) -> None:
    """Rows are stored in split order, and each part is the copy `split_validation` would cut."""
    whole = datasets.load_image_folder(small_root, 32, cache=False)
    train, validation = datasets.split_validation(whole, 0.1)
    split = datasets.load_image_folder_split(small_root, 32, validation_fraction=0.1, cache_decoded=False)
    assert torch.equal(split.train.images, train.images) and torch.equal(split.train.labels, train.labels)
    assert torch.equal(split.validation.images, validation.images)


@pytest.mark.parametrize(
    ("device", "mapped", "needed", "free", "resident"),
    [
        ("cpu", False, 10, 0, True),  # in memory: batches gathered where the set is
        ("cpu", True, 10, 0, False),  # mapped: stays mapped, batches streamed
        ("cuda", False, 40, 100, True),  # fits half the GPU's free memory: one device copy
        ("cuda", True, 40, 100, True),
        ("cuda", False, 60, 100, False),  # does not: pinned batches, copied per step
        ("cuda", True, 60, 100, False),
    ],
)
def test_a_gpu_gets_a_copy_of_the_set_only_when_it_fits_else_batches_are_streamed(
    device: str, mapped: bool, needed: int, free: int, resident: bool
) -> None:
    assert holds_resident(torch.device(device), mapped, needed, free) is resident


def test_auto_streams_from_disk_a_set_whose_memory_peak_exceeds_the_limit(
    small_root: Path, tmp_path: Path
) -> None:
    """400 images of 3x32x32 peak above 1 MB in memory: auto maps them from the cache instead, and
    memory refuses them naming data.cache."""
    budget = memory.DataBudget(1 << 20, 1, 32, augment=True, batch_size=16)
    split = datasets.load_image_folder_split(
        small_root, 32, cache="auto", cache_dir=str(tmp_path / "cache"), budget=budget
    )
    assert split.mapped and len(split.train) == 400
    with pytest.raises(DataError, match=r"400 images of 3x32x32 .* set data.cache to auto or disk"):
        datasets.load_image_folder_split(small_root, 32, cache="memory", budget=budget)
    roomy = memory.DataBudget(1 << 30, 1, 32, augment=True, batch_size=16)
    assert not datasets.load_image_folder_split(small_root, 32, cache="auto", budget=roomy).mapped
