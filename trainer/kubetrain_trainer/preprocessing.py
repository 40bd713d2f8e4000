"""The one definition of how an image becomes a network input, shared by training, evaluation and predict.

The seed tutorials trained without normalisation but normalised at inference; here the decode step and
the normalisation constants live together and are stored in the model file, so they cannot diverge.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch
    from PIL import Image


@dataclass(frozen=True)
class Preprocessing:
    """Resize side and per-channel mean/std (on the 0..1 scale) applied to uint8 RGB images."""

    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, so the model file stays loadable with `torch.load(weights_only=True)`."""
        data = asdict(self)
        data["mean"] = list(self.mean)
        data["std"] = list(self.std)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Preprocessing:
        """Inverse of `to_dict`."""
        return cls(int(data["image_size"]), tuple(data["mean"]), tuple(data["std"]))  # type: ignore[arg-type]

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 NCHW batch to normalised float32, done per batch (cheaper than storing floats).

        One fused multiply-add reads the uint8 pixels and writes the floats (a conversion followed by a
        subtraction and a division took three passes, measured 1.7x slower). Keeps the input's memory
        format, so channels_last batches stay channels_last.
        """
        import torch

        scale = 1.0 / (torch.tensor(self.std, device=images.device).view(1, 3, 1, 1) * 255.0)
        shift = -torch.tensor(self.mean, device=images.device).view(1, 3, 1, 1) * 255.0 * scale
        return torch.addcmul(shift, images, scale)


def fit_preprocessing(images: torch.Tensor, image_size: int) -> Preprocessing:
    """Per-channel mean/std of a uint8 NCHW training set, so any ImageFolder is normalised correctly.

    Large sets are estimated from an evenly spaced subsample. The sums run in float64 over chunks of
    `memory.WORK_ELEMENTS`, so the work takes tens of MiB whatever the images' size (one float copy of a
    10,000-image sample at 128 px was 2 GB) and reads a memory-mapped set chunk by chunk."""
    import torch

    from kubetrain_trainer import memory

    sample = images if images.numel() < 50_000_000 else images[:: max(1, images.shape[0] // 10_000)]
    sums = torch.zeros(3, dtype=torch.float64)
    squares = torch.zeros(3, dtype=torch.float64)
    chunk = memory.work_images(int(sample[0].numel()))
    for start in range(0, len(sample), chunk):
        part = sample[start : start + chunk].to(torch.float64).div_(255.0)
        sums += part.sum(dim=(0, 2, 3))
        squares += part.square_().sum(dim=(0, 2, 3))
    count = sample.numel() // 3
    mean = sums / count
    std = ((squares - count * mean.square()) / (count - 1)).clamp_min(0).sqrt().clamp_min(1e-3)
    return Preprocessing(
        image_size,
        tuple(round(float(v), 6) for v in mean),  # type: ignore[arg-type]
        tuple(round(float(v), 6) for v in std),  # type: ignore[arg-type]
    )


def pil_to_array(image: Image.Image, image_size: int) -> np.ndarray:
    """RGB conversion and bilinear resize of one PIL image into a uint8 HWC array (numpy only, no torch:
    decoding worker processes stay light)."""
    import numpy as np
    from PIL import Image

    image = image.convert("RGB")
    if image.size != (image_size, image_size):
        image = image.resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.uint8)


def pil_to_uint8(image: Image.Image, image_size: int) -> torch.Tensor:
    """`pil_to_array` as a uint8 CHW tensor."""
    import torch

    return torch.from_numpy(pil_to_array(image, image_size).copy()).permute(2, 0, 1).contiguous()


def decode_file_array(path: Path, image_size: int) -> np.ndarray:
    """Decode one image file into a uint8 HWC array; raises OSError (or PIL's UnidentifiedImageError)
    when it is not an image.

    PIL rather than torchvision.io, whose decoders are deprecated since torchvision 0.29.
    """
    from PIL import Image

    with Image.open(path) as image:
        return pil_to_array(image, image_size)


def decode_file(path: Path, image_size: int) -> torch.Tensor:
    """`decode_file_array` as a uint8 CHW tensor."""
    import torch

    return torch.from_numpy(decode_file_array(path, image_size).copy()).permute(2, 0, 1).contiguous()
