"""Fixtures for trainer tests: the committed CIFAR-10 sample, extracted once per session."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from trainer_helpers import SAMPLE_TARBALL


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed CIFAR-10 sample (300 real images per class) extracted once: an ImageFolder root."""
    target = tmp_path_factory.mktemp("cifar10-sample")
    with tarfile.open(SAMPLE_TARBALL) as archive:
        archive.extractall(target, filter="data")
    return target / "cifar10-sample" / "train"


@pytest.fixture
def small_root(sample_root: Path, tmp_path: Path) -> Path:
    """A writable 40-images-per-class copy of the sample, for tests that corrupt or cache data."""
    root = tmp_path / "small"
    for class_dir in sorted(sample_root.iterdir()):
        if class_dir.name.startswith("."):
            continue
        (root / class_dir.name).mkdir(parents=True)
        for image in sorted(class_dir.iterdir())[:40]:
            (root / class_dir.name / image.name).write_bytes(image.read_bytes())
    return root
