"""Learning-rate schedules: warmup then one-cycle or cosine decay, as pure functions of the step."""

from __future__ import annotations

import itertools

import pytest
from kubetrain_trainer.config import OptimizerConfig
from kubetrain_trainer.optim import lr_factor

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("schedule", ["onecycle", "cosine"])
def test_warmup_rises_to_peak_then_decays_to_zero(schedule: str) -> None:
    config = OptimizerConfig(schedule=schedule, warmup_epochs=1)
    factors = [lr_factor(config, step, total_steps=40, steps_per_epoch=10) for step in range(40)]
    assert factors[0] == pytest.approx(0.1)
    assert factors[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in itertools.pairwise(factors[:10]))
    assert all(a >= b for a, b in itertools.pairwise(factors[9:]))
    assert factors[-1] < 0.1


def test_constant_schedule_without_warmup_keeps_the_peak() -> None:
    config = OptimizerConfig()
    assert {lr_factor(config, s, 30, 10) for s in range(30)} == {1.0}
