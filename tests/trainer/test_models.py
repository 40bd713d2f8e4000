"""Model shapes (the fixed SimpleCNN takes 2304 features into fc1; every model maps 32x32 to logits),
the whitened network's data-fitted first layer and its identity initialisation."""

from __future__ import annotations

import pytest
import torch
from kubetrain_trainer import models
from kubetrain_trainer.config import TrainerConfig
from pydantic import ValidationError

pytestmark = pytest.mark.unit


def test_simple_cnn_fc1_takes_2304_inputs_for_32px_images() -> None:
    model = models.SimpleCNN()
    assert model.fc1.in_features == 2304
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    assert torch.allclose(out.exp().sum(dim=1), torch.ones(2))  # log-probabilities, as the tutorial


@pytest.mark.parametrize("name", ["simple_cnn", "resnet_small", "whitened_cnn", "resnet18"])
def test_every_model_classifies_channels_last_32px_batches(name: str) -> None:
    model = models.build(name, num_classes=7, width=16).to(memory_format=torch.channels_last)
    images = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    assert model(images).shape == (2, 7)


def _correlated_images(n: int = 512) -> torch.Tensor:
    """Smooth images with correlated channels, as natural images are: neighbouring pixels look alike."""
    gen = torch.Generator().manual_seed(0)
    coarse = torch.randn(n, 1, 8, 8, generator=gen)
    base = torch.nn.functional.interpolate(coarse, size=32, mode="bilinear")
    return base.expand(n, 3, 32, 32) * torch.tensor([1.0, 0.8, 0.6]).view(1, 3, 1, 1) + 0.5 * torch.randn(
        n, 3, 32, 32, generator=gen
    )


def test_patch_whitening_maps_training_patches_to_uncorrelated_unit_variance_features() -> None:
    images = _correlated_images()
    layer = models.PatchWhitening()
    layer.fit(images)
    with torch.no_grad():
        features = layer(images)
    positive = features[:, : layer.out_channels // 2].permute(0, 2, 3, 1).reshape(-1, layer.out_channels // 2)
    covariance = torch.cov(positive.T.double())
    assert torch.allclose(covariance, torch.eye(len(covariance), dtype=torch.float64), atol=0.02)
    negative = features[:, layer.out_channels // 2 :]
    assert torch.allclose(negative, -features[:, : layer.out_channels // 2])  # both signs survive a GELU


def test_whitened_cnn_trains_everything_but_the_whitening_filters_and_batch_norm_scales() -> None:
    model = models.WhitenedCNN(num_classes=10, width=8)
    model.fit_whitening(_correlated_images(64))
    fitted = model.whiten.conv.weight.clone()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    loss = torch.nn.functional.cross_entropy(model(_correlated_images(16)), torch.arange(16) % 10)
    loss.backward()
    optimizer.step()
    assert torch.equal(model.whiten.conv.weight, fitted)
    assert model.whiten.conv.bias.requires_grad
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(not m.weight.requires_grad and m.bias.requires_grad for m in norms)


def test_global_max_takes_each_channels_maximum_and_routes_its_gradient_to_one_position() -> None:
    x = torch.zeros(2, 3, 4, 4)
    x[0, 1, 2, 3] = x[0, 1, 0, 0] = 5.0  # a tie: the gradient still reaches exactly one position
    x[1, 2, 1, 1] = -1.0
    x.requires_grad_(True)
    pooled = models.global_max(x)
    assert torch.equal(pooled.detach(), torch.amax(x.detach(), dim=(2, 3)))
    pooled[0, 1].backward()
    assert x.grad is not None
    assert x.grad.sum() == 1.0 and int((x.grad != 0).sum()) == 1
    assert x.grad[0, 1, 2, 3] + x.grad[0, 1, 0, 0] == 1.0


def test_identity_init_passes_each_input_channel_through_its_filter_and_leaves_the_others_random() -> None:
    torch.manual_seed(3)
    plain = models.WhitenedCNN(num_classes=10, width=8)
    torch.manual_seed(3)
    identity = models.WhitenedCNN(num_classes=10, width=8, identity=True)
    plain_params = dict(plain.named_parameters())
    for name, conv in identity.named_modules():
        if not (isinstance(conv, torch.nn.Conv2d) and name.startswith("groups.")):
            continue
        passed = min(conv.in_channels, conv.out_channels)  # the first group narrows 24 whitened channels to 8
        x = torch.randn(2, conv.in_channels, 5, 5)
        with torch.no_grad():
            assert torch.allclose(conv(x)[:, :passed], x[:, :passed], atol=1e-6), name
        # The other filters are the plain model's: dirac_ draws no random numbers, so nothing shifted.
        assert torch.equal(conv.weight[passed:], plain_params[f"{name}.weight"][passed:]), name
    for name, param in identity.named_parameters():
        if not name.startswith("groups.") or "conv" not in name:
            assert torch.equal(param, plain_params[name]), name


def test_identity_init_is_refused_for_a_model_it_does_not_shape() -> None:
    with pytest.raises(
        ValidationError, match=r"identity_init needs model whitened_cnn, got model resnet_small"
    ):
        TrainerConfig(model="resnet_small", identity_init=True)
