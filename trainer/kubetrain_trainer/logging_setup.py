"""Log format: one line per event. Training prefixes the rank so interleaved workers stay legible; the
single-process commands (evaluate, predict) have no rank, and a `rank0` there would only puzzle."""

from __future__ import annotations

import logging
import sys


def configure(rank: int | None = None, verbose: bool = False) -> None:
    """Log to stderr with timestamps; ranks other than 0 only report warnings unless `verbose`."""
    level = logging.INFO if not rank or verbose else logging.WARNING
    prefix = "" if rank is None else f"rank{rank} "
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
