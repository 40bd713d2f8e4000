"""The floating-point type convolutions and matrix products run in (`TrainerConfig.precision`).

bf16 autocast halves the bytes each convolution moves and runs on the bf16 units of GPUs and of CPUs
with AMX (Intel Sapphire Rapids and later), where whitened_cnn trains 2-3x faster than in fp32 on two
cores (the fast CPU recipe in this package's README), or with AVX512-BF16 (AMD Zen 4 and later), where it
trains 1.55x faster (1,939 against 1,252 img/s at width 32 on two Zen 4 cores, the budget runs of
`benchmarks/results/trainer-speed-recipe-seed-report-zen4-*-muon.md`). Batch-norm
statistics, the loss and the optimiser stay fp32 under autocast, so no loss scaling is needed. On CPUs
with neither, bf16 is emulated and slower than fp32; `auto` keeps every CPU in fp32 (runs stay
bit-for-bit what they were) and only names the faster choice in the log where the CPU has the units.
GPUs before Ampere (compute capability 8.0: V100, T4) have no bf16 units either; CUDA emulates it
there, slower than fp32, so `auto` keeps them in fp32 too.
"""

from __future__ import annotations

import contextlib

import torch

from kubetrain_trainer.config import Precision

CPU_BF16_UNITS = (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
"""The CPU features that make bf16 convolutions faster than fp32 ones, best first, with torch's probe."""


def cpu_bf16_units() -> str | None:
    """The name of this CPU's best bf16 units (`CPU_BF16_UNITS`), or None where bf16 is only emulated."""
    for name, probe_name in CPU_BF16_UNITS:
        probe = getattr(torch.cpu, probe_name, None)
        if probe is not None and probe():
            return name
    return None


BF16_COMPUTE_CAPABILITY = (8, 0)
"""The first CUDA compute capability with bf16 tensor cores (Ampere, A100); before it bf16 is emulated."""


def compute_dtype(
    precision: Precision, device: torch.device, *, capability: tuple[int, int] | None = None
) -> torch.dtype:
    """bf16 when asked, or for `auto` on a GPU that computes in bf16 natively; fp32 otherwise (so `auto`
    on CPU is bit-for-bit fp32). `capability` is the GPU's compute capability, asked of `device` when not
    given."""
    if precision == "bf16":
        return torch.bfloat16
    if precision == "auto" and device.type == "cuda":
        if capability is None:
            capability = torch.cuda.get_device_capability(device)
        return torch.bfloat16 if tuple(capability) >= BF16_COMPUTE_CAPABILITY else torch.float32
    return torch.float32


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[object]:
    """Autocast to `dtype` on `device`, or nothing at all for fp32 (no autocast bookkeeping per op)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
