"""The networks `TrainerConfig.model` names, each built for 32x32-class inputs."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional


class SimpleCNN(nn.Module):
    """The tutorial network, fixed: for 32x32 inputs fc1 takes 64 x 6 x 6 = 2304 features (not 9216).

    32 -conv3-> 30 -pool-> 15 -conv3-> 13 -pool-> 6, hence 6 x 6 maps of 64 channels. It returns
    log-probabilities as the tutorial did; cross-entropy on them equals cross-entropy on logits because
    log_softmax is idempotent.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(2304, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(functional.relu(self.conv1(x)))
        x = self.pool(functional.relu(self.conv2(x)))
        x = functional.relu(self.fc1(torch.flatten(x, 1)))
        return functional.log_softmax(self.fc2(x), dim=1)


def global_max(x: torch.Tensor) -> torch.Tensor:
    """Each channel's maximum over the map, (N, C, H, W) -> (N, C), routing the gradient to one position.

    A max-pool with indices rather than `torch.amax`, whose backward splits the gradient among tied
    maxima: compiled with bf16 autocast on a GPU (torch 2.11, H200), that split made every gradient NaN
    from the first step, while the same network compiled in fp32 or run eagerly trained normally.
    """
    return functional.adaptive_max_pool2d(x, 1).flatten(1)


def _conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.GELU())


class _Stage(nn.Module):
    """conv -> 2x2 max-pool -> BN -> GELU, then one residual conv-BN-GELU at the pooled resolution.

    Pooling right after the first conv (as the CIFAR-10 speed-run networks do) quarters the cost of
    everything after it; the residual conv adds depth without a projection shortcut.
    """

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.bn = nn.BatchNorm2d(c_out)
        self.residual = _conv_bn(c_out, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = functional.gelu(self.bn(self.pool(self.conv(x))))
        return x + self.residual(x)


class ResNetSmall(nn.Module):
    """Narrow residual network with batch norm for fast speed-to-accuracy on small images.

    Stem at full resolution, three stages of width (w, 2w, 4w) that each halve the resolution, global
    max-pool and a linear head whose output is scaled down (a fixed temperature that keeps early logits
    small, which lets high learning rates train stably).
    """

    def __init__(self, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.stem = _conv_bn(3, max(8, width // 2))
        self.stages = nn.Sequential(
            _Stage(max(8, width // 2), width), _Stage(width, 2 * width), _Stage(2 * width, 4 * width)
        )
        self.head = nn.Linear(4 * width, num_classes, bias=False)
        self.logit_scale = 1.0 / 8.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        x = global_max(x)
        return self.head(x) * self.logit_scale


WHITENING_PATCH = 2
"""Side of the patches the whitening layer decorrelates (2x2 x 3 channels = 12 dimensions)."""


class PatchWhitening(nn.Module):
    """A frozen 2x2 convolution that whitens the image's patches, followed by a trainable bias.

    Its filters are the eigenvectors of the training patches' covariance, each scaled by one over the
    square root of its eigenvalue, and their negatives (so a following GELU keeps both signs): the first
    layer starts out decorrelating its input instead of having to learn to, which the CIFAR-10 speed runs
    (hlb-CIFAR10, airbench) found buys several points of accuracy in the first epochs for free. The
    weights are fitted once from data (`fit`) and saved with the model; only the bias trains.
    """

    def __init__(self) -> None:
        super().__init__()
        dims = 3 * WHITENING_PATCH**2
        self.conv = nn.Conv2d(3, 2 * dims, WHITENING_PATCH, bias=True)
        self.conv.weight.requires_grad_(False)

    @property
    def out_channels(self) -> int:
        return self.conv.out_channels

    @torch.no_grad()
    def fit(self, images: torch.Tensor, eps: float = 5e-4) -> None:
        """Set the filters from normalised float NCHW `images` (a few thousand suffice)."""
        patches = functional.unfold(images.float(), WHITENING_PATCH).transpose(1, 2)
        patches = patches.reshape(-1, patches.shape[-1]).double()
        patches = patches - patches.mean(dim=0)
        covariance = patches.T @ patches / len(patches)
        eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
        filters = eigenvectors.T / torch.sqrt(eigenvalues + eps)[:, None]
        filters = filters.reshape(-1, 3, WHITENING_PATCH, WHITENING_PATCH).float()
        self.conv.weight.copy_(torch.cat([filters, -filters]))
        self.conv.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def _batch_norm(channels: int) -> nn.BatchNorm2d:
    """Batch norm as the speed runs set it: fast-moving statistics, no learned scale (only a shift).

    A short run has few steps for the running averages to catch up, hence momentum 0.4 (torch's
    convention: the new batch's weight); a learned scale is redundant before GELU at these widths and
    training it costs accuracy at high learning rates, so it stays 1.
    """
    norm = nn.BatchNorm2d(channels, momentum=0.4, eps=1e-12)
    norm.weight.requires_grad_(False)
    return norm


@torch.no_grad()
def identity_init(conv: nn.Conv2d) -> None:
    """Make filter i of a same-padded conv pass input channel i through unchanged, for every i both have.

    The speed runs start every 3x3 conv so (airbench's ablations: 94% in 18 epochs instead of 21): an
    untrained stack then carries the whitened image to the head from the first step, and the remaining
    filters keep their random initialisation to break symmetry. `nn.init.dirac_` writes no random numbers,
    so every other weight is what it would have been without it.
    """
    nn.init.dirac_(conv.weight[: conv.in_channels])


class _ConvGroup(nn.Module):
    """conv -> 2x2 max-pool -> BN -> GELU -> conv -> BN -> GELU: one resolution step of WhitenedCNN."""

    def __init__(self, c_in: int, c_out: int, identity: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = _batch_norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = _batch_norm(c_out)
        if identity:
            identity_init(self.conv1)
            identity_init(self.conv2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = functional.gelu(self.norm1(self.pool(self.conv1(x))))
        return functional.gelu(self.norm2(self.conv2(x)))


class WhitenedCNN(nn.Module):
    """The airbench-style network sized for a few CPU cores: patch whitening, three conv groups, max-pool.

    32x32 -whiten 2x2-> 31 -> groups of widths (w, 2w, 4w) at 15, 7 and 3 pixels -> global max -> linear
    head scaled by 1/9 (small early logits let the high learning rates of short schedules train stably).
    Call `fit_whitening` with training images before training; a loaded checkpoint restores it instead.
    `identity` starts the group convolutions as `identity_init` does (`TrainerConfig.identity_init`).
    """

    def __init__(self, num_classes: int = 10, width: int = 32, identity: bool = False) -> None:
        super().__init__()
        self.whiten = PatchWhitening()
        self.groups = nn.Sequential(
            _ConvGroup(self.whiten.out_channels, width, identity),
            _ConvGroup(width, 2 * width, identity),
            _ConvGroup(2 * width, 4 * width, identity),
        )
        self.head = nn.Linear(4 * width, num_classes, bias=False)
        self.logit_scale = 1.0 / 9.0

    def fit_whitening(self, images: torch.Tensor) -> None:
        """Fit the whitening filters to normalised training images."""
        self.whiten.fit(images)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.groups(functional.gelu(self.whiten(x)))
        x = global_max(x)
        return self.head(x) * self.logit_scale


def resnet18_small_images(num_classes: int = 10) -> nn.Module:
    """torchvision ResNet-18 with a 3x3 stride-1 stem and no max-pool, the usual CIFAR adaptation.

    The ImageNet stem (7x7 stride 2 + max-pool) would shrink 32x32 inputs to 8x8 before the first block.
    """
    import torchvision

    model = torchvision.models.resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def build(name: str, num_classes: int, width: int = 32, identity: bool = False) -> nn.Module:
    """The model named by `TrainerConfig.model`; `identity` is `TrainerConfig.identity_init` (whitened_cnn
    only, which the config enforces)."""
    if name == "simple_cnn":
        return SimpleCNN(num_classes)
    if name == "resnet_small":
        return ResNetSmall(num_classes, width)
    if name == "whitened_cnn":
        return WhitenedCNN(num_classes, width, identity)
    if name == "resnet18":
        return resnet18_small_images(num_classes)
    raise ValueError(f"unknown model {name!r}")
