"""A decoded data set as one file: fixed-size uint8 images that every process of a node memory-maps.

Mapped read-only pages live once in the node's page cache however many processes map them, and the kernel
may drop them and read them back under memory pressure: a set larger than the pod's memory limit trains
from it without being OOM-killed, and LOCAL_WORLD_SIZE processes hold one copy, not one each. The
in-memory path reads the same file into process memory (one copy, no decoding) when it fits.

Layout, little-endian: the 8-byte MAGIC, the JSON header's length (8 bytes), the JSON header, zeros to a
multiple of ALIGN; the labels (int64, `count`), zeros to ALIGN; the images (uint8, count x size x size x
3, channels last: how images decode, and the layout crops gather whole pixels from). The rows are in
split order, the `train` rows first and then the validation rows, so both parts are slices (views) of the
file, never copies. The header's `source_digest` names the listing the rows were decoded from (paths,
labels, sizes, modification times, image size, split): a changed data set is rewritten, not reused.

Files are written atomically (`atomic.write_atomic`: a temporary file, fsynced, then renamed), so a
reader never maps half a file; the writer drops its written pages from the page cache as it goes, so
writing a set larger than the pod's memory does not fill the pod's memory with dirty pages.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from kubetrain_trainer import atomic

if TYPE_CHECKING:
    import torch

MAGIC = b"KTDECOD1"
FORMAT = 1
ALIGN = 4096
"""Sections start on page boundaries, so the images map with the page size's alignment."""
WRITE_BACK_BYTES = 64 << 20
"""The writer flushes and drops its pages from the page cache after about this many bytes: the dirty
pages a pod holds while writing are bounded by this, not by the data set."""


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


@dataclass(frozen=True)
class Header:
    """What a cache file holds: its rows, their size, labels' classes and the listing they came from."""

    count: int
    train: int
    """Rows [0, train) are the training split, [train, count) the validation split."""
    image_size: int
    classes: tuple[str, ...]
    source_digest: str
    format: int = FORMAT

    def encode(self) -> bytes:
        fields = asdict(self)
        fields["classes"] = list(self.classes)
        return json.dumps(fields, sort_keys=True).encode()

    @property
    def labels_offset(self) -> int:
        return _aligned(len(MAGIC) + 8 + len(self.encode()))

    @property
    def images_offset(self) -> int:
        return _aligned(self.labels_offset + 8 * self.count)

    @property
    def image_bytes(self) -> int:
        return 3 * self.image_size**2

    @property
    def file_size(self) -> int:
        return self.images_offset + self.count * self.image_bytes


def read_header(path: Path) -> Header | None:
    """The header of the complete cache file at `path`; None when it is missing, another format, or not
    as long as its header says (which an atomic write never leaves, but a copied or damaged file may)."""
    try:
        with path.open("rb") as handle:
            if handle.read(len(MAGIC)) != MAGIC:
                return None
            length = int.from_bytes(handle.read(8), "little")
            fields: dict[str, Any] = json.loads(handle.read(length))
        if fields.get("format") != FORMAT:
            return None
        fields["classes"] = tuple(fields["classes"])
        header = Header(**fields)
        return header if path.stat().st_size == header.file_size else None
    except (OSError, ValueError, TypeError):
        return None


def _drop_written(handle: BinaryIO) -> None:
    """Write back what was written so far and drop it from the page cache (a hint; never fails)."""
    handle.flush()
    os.fdatasync(handle.fileno())
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def write(path: Path, header: Header, labels: np.ndarray, chunks: Iterable[np.ndarray]) -> None:
    """Atomically write a cache file of `header`'s rows: `labels` (int64, count) and the images, given as
    uint8 (n, size, size, 3) `chunks` in row order whose n add up to `header.count`."""
    if labels.shape != (header.count,):
        raise ValueError(f"{len(labels)} labels for {header.count} rows")

    def fill(tmp: Path) -> None:
        with tmp.open("wb") as handle:
            encoded = header.encode()
            handle.write(MAGIC + len(encoded).to_bytes(8, "little") + encoded)
            handle.seek(header.labels_offset)
            handle.write(labels.astype("<i8").tobytes())
            handle.seek(header.images_offset)
            rows, unflushed = 0, 0
            shape = (header.image_size, header.image_size, 3)
            for chunk in chunks:
                if chunk.dtype != np.uint8 or chunk.shape[1:] != shape:
                    raise ValueError(f"chunk of {chunk.dtype} {chunk.shape}, expected uint8 (n, *{shape})")
                handle.write(np.ascontiguousarray(chunk).data)
                rows += len(chunk)
                unflushed += chunk.nbytes
                if unflushed >= WRITE_BACK_BYTES:
                    _drop_written(handle)
                    unflushed = 0
            if rows != header.count:
                raise ValueError(f"{rows} images written for {header.count} rows")
            _drop_written(handle)

    atomic.write_atomic(path, fill)


def _as_tensors(images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """NHWC uint8 rows as an NCHW tensor (channels-last strides, no copy) and the labels as int64."""
    import torch

    return torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(labels.astype(np.int64))


def open_mapped(path: Path, header: Header) -> tuple[torch.Tensor, torch.Tensor]:
    """The images of the file, memory-mapped (pages are read on first touch and shared with every other
    process mapping the file), and its labels, read into memory.

    Mapped copy-on-write ("c"): writable for torch, which warns about read-only arrays, while nothing here
    writes, so every page stays the page cache's one shared copy."""
    labels = np.fromfile(path, dtype="<i8", count=header.count, offset=header.labels_offset)
    shape = (header.count, header.image_size, header.image_size, 3)
    images = np.memmap(path, dtype=np.uint8, mode="c", offset=header.images_offset, shape=shape)
    return _as_tensors(images, labels)


def read_into_memory(path: Path, header: Header) -> tuple[torch.Tensor, torch.Tensor]:
    """The images and labels of the file read into this process's memory: one copy, nothing decoded."""
    labels = np.fromfile(path, dtype="<i8", count=header.count, offset=header.labels_offset)
    images = np.fromfile(
        path, dtype=np.uint8, count=header.count * header.image_bytes, offset=header.images_offset
    )
    return _as_tensors(images.reshape(header.count, header.image_size, header.image_size, 3), labels)
