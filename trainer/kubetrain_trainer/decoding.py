"""Decoding a whole image set at once: chunks of files spread over worker processes.

JPEG decoding is per-file Python and C work that holds the GIL (a thread pool measured 1.6x slower than one
loop), so the parallel unit is a process. Workers are forked: they inherit the loaded modules instead of
importing torch again (a spawned worker would spend about as long importing as decoding its share), and
they only use PIL and numpy, so the parent's thread pools do not matter to them. Each returns its chunk
as one uint8 array.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path

import numpy as np

from kubetrain_trainer import cpu_budget, preprocessing
from kubetrain_trainer.failures import DataError

PARALLEL_FROM_FILES = 2000
"""Fewer files than this decode in the calling process: starting workers would cost more than it saves."""


def decode_chunk(paths: list[Path], image_size: int) -> np.ndarray:
    """Decode `paths` in order into one (N, H, W, 3) uint8 array; a failing file is a DataError naming it."""
    images = np.empty((len(paths), image_size, image_size, 3), dtype=np.uint8)
    for index, path in enumerate(paths):
        try:
            images[index] = preprocessing.decode_file_array(path, image_size)
        except Exception as error:
            raise DataError(f"cannot decode image {path}: {error}") from error
    return images


def decode_files(paths: list[Path], image_size: int, workers: int | None = None) -> np.ndarray:
    """Decode `paths` in order with `workers` processes (default: one per CPU the process may use, which a
    container's CPU limit caps: more would only queue for the quota)."""
    workers = workers or cpu_budget.usable_cpus()
    if workers <= 1 or len(paths) < PARALLEL_FROM_FILES:
        return decode_chunk(paths, image_size)
    per_chunk = -(-len(paths) // (4 * workers))  # a few chunks per worker even out slow ones
    chunks = [paths[start : start + per_chunk] for start in range(0, len(paths), per_chunk)]
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return np.concatenate(list(pool.map(decode_chunk, chunks, repeat(image_size))))
