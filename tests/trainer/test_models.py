"""Model shapes: the fixed SimpleCNN takes 2304 features into fc1; every model maps 32x32 to logits."""

from __future__ import annotations

import pytest
import torch
from kubetrain_trainer import models

pytestmark = pytest.mark.unit


def test_simple_cnn_fc1_takes_2304_inputs_for_32px_images() -> None:
    model = models.SimpleCNN()
    assert model.fc1.in_features == 2304
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    assert torch.allclose(out.exp().sum(dim=1), torch.ones(2))  # log-probabilities, as the tutorial


@pytest.mark.parametrize("name", ["simple_cnn", "resnet_small", "resnet18"])
def test_every_model_classifies_channels_last_32px_batches(name: str) -> None:
    model = models.build(name, num_classes=7, width=16).to(memory_format=torch.channels_last)
    images = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    assert model(images).shape == (2, 7)
