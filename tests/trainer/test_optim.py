"""Learning-rate schedules: warmup then one-cycle or cosine decay, as pure functions of the step."""

from __future__ import annotations

import itertools

import pytest
from kubetrain_trainer.config import OptimizerConfig
from kubetrain_trainer.optim import lr_factor, run_length

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


@pytest.mark.parametrize(
    ("steps_per_epoch", "epochs", "total_steps", "started_epochs"),
    [
        (10, 3, 30, 3),  # whole epochs as before
        (10, 1.5, 15, 2),  # one pass and half of the next
        (8, 0.25, 2, 1),  # less than one pass
        (10, 0.01, 1, 1),  # never fewer than one step
        (10, 2.04, 20, 2),  # a fraction under half a step rounds away: no empty third epoch
    ],
)
def test_a_run_of_fractional_epochs_is_whole_steps_over_the_started_epochs(
    steps_per_epoch: int, epochs: float, total_steps: int, started_epochs: int
) -> None:
    assert run_length(steps_per_epoch, epochs) == (steps_per_epoch, total_steps, started_epochs)


def test_the_schedule_of_a_fractional_run_decays_over_its_own_steps() -> None:
    config = OptimizerConfig(schedule="onecycle", warmup_epochs=0.3)  # 3 warmup steps of 10 per epoch
    length = run_length(10, 1.5)
    factors = [lr_factor(config, s, length.total_steps, 10) for s in range(length.total_steps)]
    assert factors[2] == 1.0  # the peak, at the end of the warmup
    assert factors[-1] == pytest.approx(1 / (15 - 3))  # one decay step from zero at the 15th step


@pytest.mark.parametrize(
    ("epochs", "steps_by_epoch"), [(3, [10, 10, 10]), (1.5, [10, 5]), (0.25, [2]), (2.96, [10, 10, 10])]
)
def test_every_epoch_but_a_fractional_runs_last_trains_all_its_steps(
    epochs: float, steps_by_epoch: list[int]
) -> None:
    length = run_length(10, epochs)
    assert [length.steps_in(epoch) for epoch in range(1, length.epochs + 1)] == steps_by_epoch
