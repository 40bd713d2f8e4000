"""Decoding a whole image set at once: chunks of files spread over worker processes.

JPEG decoding is per-file Python and C work that holds the GIL (a thread pool measured 1.6x slower than one
loop), so the parallel unit is a process. Workers are forked: they inherit the loaded modules instead of
importing torch again (a spawned worker would spend about as long importing as decoding its share), and
they only use PIL and numpy, so the parent's thread pools do not matter to them. Each returns its chunk
as one uint8 array, and the chunks stream out in order (`datasets` writes them into the decoded cache).
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np

from kubetrain_trainer import cpu_budget, preprocessing
from kubetrain_trainer.failures import DataError

PARALLEL_FROM_FILES = 2000
"""Fewer files than this decode in the calling process: starting workers would cost more than it saves."""
DECODE_CHUNK_FILES = 256
"""Files per decoding task: chunks stream out in order (into the cache file), at most two per worker in
flight, so decoding holds a few MiB per worker, not the data set."""


def decode_chunk(paths: list[Path], image_size: int) -> np.ndarray:
    """Decode `paths` in order into one (N, H, W, 3) uint8 array; a failing file is a DataError naming it."""
    images = np.empty((len(paths), image_size, image_size, 3), dtype=np.uint8)
    for index, path in enumerate(paths):
        try:
            images[index] = preprocessing.decode_file_array(path, image_size)
        except Exception as error:
            raise DataError(f"cannot decode image {path}: {error}") from error
    return images


def decode_stream(paths: list[Path], image_size: int, workers: int | None = None) -> Iterator[np.ndarray]:
    """`paths` decoded in order, as uint8 (n, size, size, 3) chunks of DECODE_CHUNK_FILES, by `workers`
    forked processes (default: one per CPU the process may use, which a container's CPU limit caps: more
    would only queue for the quota), with at most two chunks per worker in flight."""
    chunks = [paths[i : i + DECODE_CHUNK_FILES] for i in range(0, len(paths), DECODE_CHUNK_FILES)]
    workers = workers or cpu_budget.usable_cpus()
    if workers <= 1 or len(paths) < PARALLEL_FROM_FILES:
        for chunk in chunks:
            yield decode_chunk(chunk, image_size)
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        pending: deque[Future[np.ndarray]] = deque()
        for chunk in chunks:
            pending.append(pool.submit(decode_chunk, chunk, image_size))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
