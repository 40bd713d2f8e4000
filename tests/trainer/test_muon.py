"""Muon: filter updates orthogonalized at a fixed filter norm, SGD for the rest, one schedule for both."""

from __future__ import annotations

import copy

import pytest
import torch
from kubetrain_trainer.config import OptimizerConfig, TrainerConfig
from kubetrain_trainer.models import build
from kubetrain_trainer.muon import orthogonalize
from kubetrain_trainer.optim import build_optimizer, set_lr
from pydantic import ValidationError
from torch import nn

pytestmark = pytest.mark.unit

MUON = OptimizerConfig(name="muon", lr=0.2, filter_lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)


@pytest.mark.parametrize(
    ("rows", "columns", "condition"),
    [(32, 216, 1.0), (216, 32, 1.0), (64, 576, 1e2), (10, 10, 1e2)],
    ids=["wide", "tall", "wide-ill-conditioned", "square"],
)
def test_orthogonalize_brings_every_singular_value_near_one(
    rows: int, columns: int, condition: float
) -> None:
    generator = torch.Generator().manual_seed(0)
    left, _ = torch.linalg.qr(torch.randn(rows, rows, generator=generator))
    right, _ = torch.linalg.qr(torch.randn(columns, columns, generator=generator))
    rank = min(rows, columns)
    spectrum = torch.logspace(0, -torch.log10(torch.tensor(condition)).item(), rank)
    matrix = left[:, :rank] @ torch.diag(spectrum * 7.0) @ right[:, :rank].T
    singular = torch.linalg.svdvals(orthogonalize(matrix))
    assert singular.min() > 0.6 and singular.max() < 1.25, singular
    assert torch.linalg.svdvals(matrix).max() == pytest.approx(7.0, rel=1e-3)  # the input was far from 1


def _model() -> nn.Module:
    torch.manual_seed(0)
    return build("whitened_cnn", 10, width=8)


def _train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        images = torch.randn(16, 3, 32, 32, generator=generator)
        labels = torch.randint(0, 10, (16,), generator=generator)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()


def test_muon_holds_every_filter_bank_at_the_norm_of_an_orthogonal_update() -> None:
    model = _model()
    optimizer = build_optimizer(model, MUON)
    set_lr(optimizer, MUON.lr, 1.0)
    _train_steps(model, optimizer, steps=6)
    for name, param in model.named_parameters():
        if param.requires_grad and param.ndim == 4:
            expected = len(param) ** 0.5
            # rescaled to it before each step, then moved by one step of filter_lr x about that norm
            assert param.norm().item() == pytest.approx(expected, rel=2 * MUON.filter_lr), name


def test_muon_trains_every_other_parameter_exactly_as_torch_sgd() -> None:
    muon_model = _model()
    sgd_model = copy.deepcopy(muon_model)
    muon = build_optimizer(muon_model, MUON)
    set_lr(muon, MUON.lr, 1.0)
    sgd = build_optimizer(sgd_model, MUON.model_copy(update={"name": "sgd"}))
    set_lr(sgd, MUON.lr, 1.0)
    frozen_filters = [param for param in sgd_model.parameters() if param.ndim == 4]
    for param in frozen_filters:
        param.requires_grad_(False)  # both runs must see the same filters: feed SGD Muon's after each step
    generator = torch.Generator().manual_seed(3)
    for _ in range(4):
        images = torch.randn(16, 3, 32, 32, generator=generator)
        labels = torch.randint(0, 10, (16,), generator=generator)
        for model, optimizer in ((muon_model, muon), (sgd_model, sgd)):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
        with torch.no_grad():
            for target, source in zip(
                frozen_filters, (p for p in muon_model.parameters() if p.ndim == 4), strict=True
            ):
                target.copy_(source)
    for (name, ours), theirs in zip(muon_model.named_parameters(), sgd_model.parameters(), strict=True):
        if ours.ndim != 4:
            torch.testing.assert_close(ours, theirs, msg=name)


def test_the_schedule_drives_filters_at_filter_lr_and_the_rest_at_lr() -> None:
    optimizer = build_optimizer(_model(), MUON)
    assert set_lr(optimizer, MUON.lr, 0.5) == pytest.approx(0.1)
    rates = {bool(group["orthogonal"]): group["lr"] for group in optimizer.param_groups}
    assert rates == {True: pytest.approx(0.025), False: pytest.approx(0.1)}


def test_a_muon_run_resumed_from_its_state_dict_continues_bit_identically() -> None:
    model = _model()
    optimizer = build_optimizer(model, MUON)
    set_lr(optimizer, MUON.lr, 1.0)
    _train_steps(model, optimizer, steps=3)
    resumed_model = copy.deepcopy(model)
    resumed = build_optimizer(resumed_model, MUON)
    resumed.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    _train_steps(model, optimizer, steps=3, seed=9)
    _train_steps(resumed_model, resumed, steps=3, seed=9)
    for ours, theirs in zip(model.state_dict().values(), resumed_model.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs)


def test_muon_refuses_a_model_whose_convolutions_do_not_all_feed_batch_norm() -> None:
    with pytest.raises(ValidationError, match=r"optimizer.name muon needs a model .*simple_cnn"):
        TrainerConfig(model="simple_cnn", optimizer={"name": "muon"})
    TrainerConfig(model="resnet_small", optimizer={"name": "muon"})
