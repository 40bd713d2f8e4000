"""Throughput, ETA and progress lines for the training loop (log lines in pods, a bar on terminals)."""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from kubetrain_trainer.optim import RunLength

log = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
    """Compact h/m/s rendering for ETAs."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ThroughputMeter:
    """Tracks global images/s and projects the time left for the remaining steps of the whole run."""

    def __init__(self, *, length: RunLength, global_batch: int, log_every: int, enabled: bool) -> None:
        self.epochs = length.epochs
        self.steps_per_epoch = length.steps_per_epoch
        self.total_steps = length.total_steps
        self.global_batch = global_batch
        self.log_every = log_every
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self._window_start = time.perf_counter()
        self._window_steps = 0
        self.images_per_second = 0.0

    def start_window(self) -> None:
        """Restart the rate measurement (after evaluation or checkpointing, which are not training)."""
        self._window_start = time.perf_counter()
        self._window_steps = 0

    def step(self, epoch: int, step: int, global_step: int, loss: torch.Tensor) -> None:
        """Account one optimiser step; every `log_every` steps emit a line (or redraw the bar on a TTY).

        `loss` stays a tensor until a line is due, so GPU runs only synchronise when they log.
        """
        self._window_steps += 1
        epochs, steps_per_epoch = self.epochs, self.steps_per_epoch
        if not self.enabled or ((step + 1) % self.log_every and step + 1 != steps_per_epoch):
            return
        elapsed = time.perf_counter() - self._window_start
        self.images_per_second = self._window_steps * self.global_batch / max(elapsed, 1e-9)
        steps_left = self.total_steps - global_step - 1
        eta = steps_left * self.global_batch / max(self.images_per_second, 1e-9)
        text = (
            f"epoch {epoch}/{epochs} step {step + 1}/{steps_per_epoch} loss {float(loss):.4f} "
            f"{self.images_per_second:.0f} img/s ETA {format_duration(eta)}"
        )
        if self.tty:
            done = int(30 * (step + 1) / steps_per_epoch)
            sys.stderr.write(f"\r[{'#' * done}{'.' * (30 - done)}] {text}")
            if step + 1 == steps_per_epoch:
                sys.stderr.write("\n")
            sys.stderr.flush()
        else:
            log.info(text)
