"""Log format for pod logs: one line per event, prefixed with the rank so interleaved workers stay legible."""

from __future__ import annotations

import logging
import sys


def configure(rank: int = 0, verbose: bool = False) -> None:
    """Log to stderr with timestamps; ranks other than 0 only report warnings unless `verbose`."""
    level = logging.INFO if rank == 0 or verbose else logging.WARNING
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
