"""Test-time augmentation: which views of a batch are predicted, and how their predictions are weighted."""

from __future__ import annotations

import pytest
import torch
from kubetrain_trainer import evaluation
from torch import nn

pytestmark = pytest.mark.unit


def test_translate_and_flip_views_are_the_batch_shifted_one_pixel_and_mirrored_weighted_to_one() -> None:
    images = torch.arange(2 * 3 * 6 * 6, dtype=torch.float32).view(2, 3, 6, 6)
    views = evaluation.test_time_views(images, flip_tta=True, translate_tta=True)
    assert sum(weight for weight, _ in views) == pytest.approx(1.0)
    weights = [weight for weight, _ in views]
    assert weights == [0.25, 0.25, 0.125, 0.125, 0.125, 0.125]
    plain, mirrored, up_left, _, down_right, _ = (view for _, view in views)
    assert torch.equal(plain, images) and torch.equal(mirrored, images.flip(3))
    assert torch.equal(up_left[..., 1:, 1:], images[..., :-1, :-1])  # content moved one pixel down-right
    assert torch.equal(down_right[..., :-1, :-1], images[..., 1:, 1:])
    assert all(view.shape == images.shape for _, view in views)


def test_without_augmentation_the_prediction_is_the_plain_log_softmax() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 5))
    images = torch.randn(3, 3, 4, 4)
    expected = torch.log_softmax(model(images), dim=1)
    assert torch.allclose(evaluation.log_probabilities(model, images, False, False), expected)
    averaged = evaluation.log_probabilities(model, images, True, True)
    assert torch.allclose(averaged.exp().sum(dim=1), torch.ones(3))
