"""Mid-epoch checkpoints come every N steps and/or every T seconds of rank 0's clock, read every few steps."""

from __future__ import annotations

import pytest
import torch
from kubetrain_trainer.checkpoint_trigger import CLOCK_CHECK_STEPS, CheckpointTrigger

pytestmark = pytest.mark.unit


class _Clock:
    """A clock the test moves by hand, so the trigger's decisions do not depend on the machine's speed."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _trigger(clock: _Clock, every_steps: int = 0, every_seconds: float = 0) -> CheckpointTrigger:
    return CheckpointTrigger(
        every_steps=every_steps,
        every_seconds=every_seconds,
        distributed=False,
        device=torch.device("cpu"),
        clock=clock,
    )


def test_a_step_interval_fires_on_its_multiples_of_the_run_step() -> None:
    trigger = _trigger(_Clock(), every_steps=7)
    assert [step for step in range(1, 30) if trigger.due(step)] == [7, 14, 21, 28]


def test_a_time_interval_fires_at_the_first_clock_check_after_it_elapsed_and_restarts() -> None:
    clock = _Clock()
    trigger = _trigger(clock, every_seconds=300)
    clock.now += 299
    assert not any(trigger.due(step) for step in range(1, 3 * CLOCK_CHECK_STEPS))
    clock.now += 1
    assert not trigger.due(3 * CLOCK_CHECK_STEPS + 1)  # the clock is only read every CLOCK_CHECK_STEPS
    assert trigger.due(4 * CLOCK_CHECK_STEPS)
    trigger.restart()
    assert not trigger.due(5 * CLOCK_CHECK_STEPS)
    clock.now += 300
    assert trigger.due(6 * CLOCK_CHECK_STEPS)


def test_both_intervals_zero_never_fire() -> None:
    clock = _Clock()
    trigger = _trigger(clock)
    clock.now += 10**6
    assert not any(trigger.due(step) for step in range(1, 200))
