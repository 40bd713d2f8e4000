"""Parallel decoding: worker processes return the same pixels, in the same order, as one loop does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kubetrain_trainer import decoding
from kubetrain_trainer.failures import DataError

pytestmark = pytest.mark.unit


def _paths(root: Path) -> list[Path]:
    return sorted(p for class_dir in sorted(root.iterdir()) for p in class_dir.iterdir())


def test_worker_processes_decode_the_same_pixels_in_file_order_as_one_loop(
    small_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _paths(small_root)
    monkeypatch.setattr(decoding, "PARALLEL_FROM_FILES", 1)
    parallel = np.concatenate(list(decoding.decode_stream(paths, 32, workers=2)))
    serial = np.concatenate(list(decoding.decode_stream(paths, 32, workers=1)))
    assert parallel.shape == (len(paths), 32, 32, 3) and parallel.dtype == np.uint8
    assert np.array_equal(parallel, serial)


def test_a_file_that_does_not_decode_in_a_worker_is_a_data_error_naming_it(
    small_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _paths(small_root)
    broken = paths[123]
    broken.write_bytes(b"not a jpeg")
    monkeypatch.setattr(decoding, "PARALLEL_FROM_FILES", 1)
    with pytest.raises(DataError, match=f"cannot decode image {broken}"):
        list(decoding.decode_stream(paths, 32, workers=2))
