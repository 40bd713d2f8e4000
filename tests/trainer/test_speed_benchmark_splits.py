"""The speed benchmark's held-out splits (issue 26): a recipe is tuned on one split and reported on
another, so `benchmarks/trainer_speed.py` carves two disjoint sets of 500 images per class out of the
training JPEGs by position, the same on every run, and trains on the images in neither.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from kubetrain_trainer import datasets

pytestmark = pytest.mark.unit

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "trainer_speed.py"


@pytest.fixture(scope="module")
def speed() -> ModuleType:
    """benchmarks/trainer_speed.py as a module (benchmarks/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("trainer_speed", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _files(count: int = 5000) -> list[str]:
    return [f"{index:05d}.jpg" for index in range(count)]


def test_the_tune_and_report_splits_hold_500_different_images_each(speed: ModuleType) -> None:
    report = speed.carve(_files(), "report").held_out
    tune = speed.carve(_files(), "tune").held_out
    assert len(report) == len(tune) == 500
    assert not set(report) & set(tune)


def test_the_tune_split_is_the_last_500_of_a_class_as_before_issue_26(speed: ModuleType) -> None:
    assert speed.carve(_files(), "tune").held_out == _files()[-500:]
    assert speed.carve(_files(), "report").held_out == _files()[:500]


def test_training_excludes_both_held_out_splits_whichever_is_scored(speed: ModuleType) -> None:
    held_out = set(_files()[:500]) | set(_files()[-500:])
    for split in speed.SPLITS:
        train = speed.carve(_files(), split).train
        assert len(train) == 4000
        assert not set(train) & held_out
    assert speed.carve(_files(), "report").train == speed.carve(_files(), "tune").train


def test_the_quick_run_trains_on_the_first_images_between_the_splits(speed: ModuleType) -> None:
    part = speed.carve(_files(), "report", train_per_class=1000)
    assert part.train == _files()[500:1500]
    assert len(part.held_out) == 500


def test_a_class_too_small_for_two_splits_and_training_is_refused(speed: ModuleType) -> None:
    with pytest.raises(ValueError, match="no training images"):
        speed.carve(_files(1000), "report")


def test_an_unknown_split_is_refused(speed: ModuleType) -> None:
    with pytest.raises(ValueError, match="not one of"):
        speed.carve(_files(), "validation")


def _archive_tree(root: Path, per_class: int) -> None:
    """An extracted archive's layout (`<work>/train/<class>/*.jpg`) with empty files: carving only links."""
    for name in ("cat", "dog"):
        (root / "train" / name).mkdir(parents=True)
        for file in _files(per_class):
            (root / "train" / name / file).touch()


def test_the_trainer_holds_out_exactly_the_split_of_a_prepared_tree(
    speed: ModuleType, tmp_path: Path
) -> None:
    _archive_tree(tmp_path, 1200)
    root = speed.prepare_data(Path("unused.tar.gz"), tmp_path, "report", None)
    classes, samples = datasets.list_image_folder(root)
    labels = torch.tensor([label for _, label in samples])
    train_idx, val_idx = datasets.split_indices(labels, len(classes), speed.held_out_fraction(root))
    held_out = {samples[i][0].name.removeprefix(speed.HELD_OUT_PREFIX) for i in val_idx.tolist()}
    trained = {samples[i][0].name.removeprefix(speed.TRAIN_PREFIX) for i in train_idx.tolist()}
    assert held_out == set(_files(1200)[:500])
    assert trained == set(_files(1200)[500:700])
    assert [samples[i][0].parent.name for i in val_idx.tolist()].count("cat") == 500


def test_a_prepared_tree_is_the_same_when_prepared_again(speed: ModuleType, tmp_path: Path) -> None:
    _archive_tree(tmp_path, 1200)
    first = speed.prepare_data(Path("unused.tar.gz"), tmp_path, "tune", None)
    listing = sorted(p.relative_to(first) for p in first.rglob("*.jpg"))
    again = speed.prepare_data(Path("unused.tar.gz"), tmp_path, "tune", None)
    assert again == first and sorted(p.relative_to(again) for p in again.rglob("*.jpg")) == listing
    fresh = tmp_path / "fresh"
    _archive_tree(fresh, 1200)
    rebuilt = speed.prepare_data(Path("unused.tar.gz"), fresh, "tune", None)
    assert sorted(p.relative_to(rebuilt) for p in rebuilt.rglob("*.jpg")) == listing
