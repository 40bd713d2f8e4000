"""ImageFolder decoding: decoded once, cached beside the tree, and decoded again into the same file when a
file changes."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from kubetrain_trainer import datasets
from kubetrain_trainer.failures import DataError

pytestmark = pytest.mark.unit


def test_decoded_tensors_are_cached_beside_the_tree_and_invalidated_by_changes(
    small_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = datasets.load_image_folder(small_root, 32, cache=True)
    assert first.images.shape == (400, 3, 32, 32) and first.images.dtype == torch.uint8
    assert first.classes[0] == "airplane" and torch.bincount(first.labels).tolist() == [40] * 10
    assert not any(p.name.startswith(".") for p in small_root.iterdir())  # other readers see only classes
    (cache_file,) = (small_root.parent / datasets.CACHE_DIR_NAME).iterdir()

    with caplog.at_level(logging.INFO):
        again = datasets.load_image_folder(small_root, 32, cache=True)
    assert "from cache" in caplog.text
    assert torch.equal(again.images, first.images)

    changed = small_root / "bird" / "0003.jpg"
    changed.write_bytes((small_root / "cat" / "0003.jpg").read_bytes())
    os.utime(changed, ns=(1, 1))
    redecoded = datasets.load_image_folder(small_root, 32, cache=True)
    index = 80 + 3  # bird is class 2; files are in name order
    assert torch.equal(redecoded.images[index], first.images[120 + 3])
    assert list(cache_file.parent.iterdir()) == [cache_file], "a changed set is rewritten, not beside it"


def test_a_root_without_class_directories_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no images here")
    with pytest.raises(DataError, match="no images under"):
        datasets.list_image_folder(tmp_path)


def test_the_origin_digests_the_file_list_the_same_wherever_it_lies_and_with_or_without_the_cache(
    sample_root: Path, tmp_path: Path
) -> None:
    def tree(root: Path) -> Path:
        for name in ("cat", "dog"):
            (root / name).mkdir(parents=True)
            for image in sorted((sample_root / name).iterdir())[:2]:
                shutil.copy(image, root / name / image.name)
        return root

    here = datasets.load_image_folder(tree(tmp_path / "here"), 32, cache=True).origin
    elsewhere_root = tree(tmp_path / "elsewhere")
    elsewhere = datasets.load_image_folder(elsewhere_root, 32, cache=False).origin
    assert here is not None and elsewhere is not None
    assert here.files == 4 and here.files_sha256 == elsewhere.files_sha256
    assert here.source == f"imagefolder {tmp_path / 'here'}"
    assert datasets.load_image_folder(tmp_path / "here", 32, cache=True).origin == here  # from the cache

    first = sorted((elsewhere_root / "dog").iterdir())[0]
    first.rename(first.with_name("renamed.jpg"))
    renamed = datasets.load_image_folder(elsewhere_root, 32, cache=False).origin
    assert renamed is not None and renamed.files_sha256 != here.files_sha256
