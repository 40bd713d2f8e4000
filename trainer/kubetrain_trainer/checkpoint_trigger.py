"""When to checkpoint in the middle of an epoch: every N steps and/or every T seconds, agreed by all ranks.

A step trigger is the same on every rank (they share the step counter). A clock is not: each rank's differs
a little, and a checkpoint taken by some ranks only would deadlock the collectives it contains. So rank 0
reads its clock every `CLOCK_CHECK_STEPS` steps and broadcasts its answer, one flag in a tiny collective
next to the gradient all-reduce every step already does (benchmarks/checkpoint_stall.py measures it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

CLOCK_CHECK_STEPS = 20
"""Steps between two reads of rank 0's clock: a checkpoint comes at most this many steps late."""


class CheckpointTrigger:
    """Says after which optimizer steps to checkpoint; every rank gets the same answer at the same step."""

    def __init__(
        self,
        *,
        every_steps: int,
        every_seconds: float,
        distributed: bool,
        device: torch.device,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.distributed = distributed
        self.device = device
        self.clock = clock
        self.last = clock()

    def restart(self) -> None:
        """A checkpoint was just taken: the time interval counts from now."""
        self.last = self.clock()

    def due(self, step: int) -> bool:
        """Whether to checkpoint after `step` optimizer steps of the run (a collective every few steps)."""
        if self.every_steps and step % self.every_steps == 0:
            return True
        if not self.every_seconds or step % CLOCK_CHECK_STEPS:
            return False
        late = self.clock() - self.last >= self.every_seconds
        if not self.distributed:
            return late
        import torch.distributed as dist

        flag = torch.tensor([int(late)], device=self.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())
