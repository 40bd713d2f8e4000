"""Lookahead: the network is reset to the moving average every k steps and ends as the average."""

from __future__ import annotations

import pytest
import torch
from kubetrain_trainer.lookahead import Lookahead
from torch import nn

pytestmark = pytest.mark.unit


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))


def _move(model: nn.Module, by: float) -> None:
    with torch.no_grad():
        for param in model.parameters():
            param.add_(by)


def test_between_updates_the_network_moves_freely_and_at_an_update_it_becomes_the_average() -> None:
    model = _model()
    start = model[0].weight.detach().clone()
    lookahead = Lookahead(model, every_steps=5, final_decay=0.5)
    total = 10
    _move(model, 1.0)
    lookahead.after_step(4, total)  # not a multiple of 5: nothing happens
    assert torch.allclose(model[0].weight, start + 1.0)
    lookahead.after_step(5, total)
    decay = 0.5 * (5 / total) ** 3
    expected = start + (1.0 - decay) * 1.0
    assert torch.allclose(model[0].weight, expected)
    assert torch.allclose(lookahead.average["0.weight"], expected)


def test_the_last_step_resets_the_network_buffers_included_to_the_average() -> None:
    model = _model()
    lookahead = Lookahead(model, every_steps=5, final_decay=0.9)
    model.train()
    model(torch.randn(8, 3))  # batch norm statistics move away from the average's
    _move(model, 2.0)
    lookahead.after_step(7, 7)
    for name, value in model.state_dict().items():
        if value.is_floating_point():
            assert torch.equal(value, lookahead.average[name]), name
    assert torch.equal(model[1].running_mean, torch.zeros(4))


def test_the_averaging_strength_grows_with_the_cube_of_progress() -> None:
    lookahead = Lookahead(_model(), final_decay=0.8)
    assert lookahead.decay_at(0, 100) == 0.0
    assert lookahead.decay_at(50, 100) == pytest.approx(0.8 / 8)
    assert lookahead.decay_at(100, 100) == pytest.approx(0.8)


def test_a_restored_average_continues_where_the_saved_one_was() -> None:
    saved = Lookahead(_model())
    _move(saved.model, 1.0)
    saved.after_step(5, 10)
    restored = Lookahead(_model())
    restored.load_state_dict(saved.state_dict())
    for name, value in saved.average.items():
        assert torch.equal(restored.average[name], value)
