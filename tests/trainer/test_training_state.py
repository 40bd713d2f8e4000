"""The state a checkpoint holds: the progress counters round-trip, older checkpoints load as an epoch's end,
and the checkpoint's keys (the file format) stay what resumed runs expect."""

from __future__ import annotations

import pytest
import torch
from kubetrain_trainer.components.training_state import CheckpointedState, TrainState
from kubetrain_trainer.lookahead import Lookahead

pytestmark = pytest.mark.unit


def test_progress_round_trips_through_its_state_dict() -> None:
    progress = TrainState(epoch=2, step=21, epoch_step=5, epoch_totals=[3.5, 30.0, 40.0])
    progress.history.append({"epoch": 2, "train_loss": 1.25})
    restored = TrainState()
    restored.load_state_dict(progress.state_dict())
    assert restored == progress
    assert restored.last_step_epoch == 3


def test_a_checkpoint_from_before_mid_epoch_resume_loads_as_an_epoch_boundary() -> None:
    restored = TrainState(epoch_step=4, epoch_totals=[1.0, 2.0, 3.0])
    restored.load_state_dict({"epoch": 3, "step": 24, "history": [{"epoch": 3}]})
    assert (restored.epoch, restored.step, restored.epoch_step) == (3, 24, 0)
    assert restored.epoch_totals == [0.0, 0.0, 0.0]
    assert restored.last_step_epoch == 3


def test_finishing_an_epoch_starts_the_next_from_its_first_step_with_empty_totals() -> None:
    progress = TrainState(epoch=1, step=15, epoch_step=7, epoch_totals=[2.0, 5.0, 56.0])
    progress.finish_epoch(2)
    assert (progress.epoch, progress.step, progress.epoch_step) == (2, 15, 0)
    assert progress.epoch_totals == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("with_lookahead", [False, True])
def test_a_checkpoint_holds_model_optimizer_progress_and_lookahead_under_the_keys_of_its_format(
    with_lookahead: bool,
) -> None:
    model = torch.nn.Linear(2, 2)
    lookahead = Lookahead(model) if with_lookahead else None
    state = CheckpointedState(model, torch.optim.SGD(model.parameters(), lr=0.1), lookahead, TrainState())
    expected = ["model", "optimizer", "state", *(["lookahead"] if with_lookahead else [])]
    assert list(state.components()) == expected
    assert state.components()["state"] is state.progress
