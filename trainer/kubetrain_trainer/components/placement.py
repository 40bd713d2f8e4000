"""Where this rank trains: its device and CPU threads, and the wrapper that keeps the replicas equal."""

from __future__ import annotations

import logging

import torch
from torch import nn

from kubetrain_trainer import cpu_budget, precision
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.failures import ConfigError

log = logging.getLogger(__name__)


def select_device(config: TrainerConfig, world: WorldEnv) -> torch.device:
    """cuda:LOCAL_RANK when GPUs are requested or (auto) visible, else the CPU; checks GPUs suffice."""
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if not use_cuda:
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        raise ConfigError("device cuda requested but no GPU is visible (torch.cuda.device_count() == 0)")
    if world.local_world_size > count:
        raise ConfigError(
            f"LOCAL_WORLD_SIZE({world.local_world_size}) processes per worker but only {count} visible GPUs"
        )
    return torch.device("cuda", world.local_rank)


def cpu_threads(config: TrainerConfig, world: WorldEnv) -> int:
    """Intra-op threads for this process: the configured count, or the CPUs the worker may use (its cgroup
    CPU quota, else its cores) split evenly among its processes."""
    if config.cpu_threads:
        return config.cpu_threads
    return max(1, cpu_budget.usable_cpus() // world.local_world_size)


def prepare(config: TrainerConfig, world: WorldEnv) -> tuple[torch.device, torch.dtype]:
    """The device and compute precision, with the process set up for them before any tensor is made:
    processes sharing a worker's CPUs split its cores, and cuDNN may pick its fastest algorithms."""
    device = select_device(config, world)
    dtype = precision.compute_dtype(config.precision, device)
    if device.type == "cpu":
        threads = cpu_threads(config, world)
        torch.set_num_threads(threads)
        if world.is_main:
            log.info(
                "%d intra-op threads per process (cpu_threads %s)", threads, config.cpu_threads or "auto"
            )
        units = precision.cpu_bf16_units() if dtype == torch.float32 and world.is_main else None
        if units:
            log.info("this CPU has %s: precision bf16 would train convolutions faster than fp32", units)
    else:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        if config.precision == "auto" and dtype == torch.float32 and world.is_main:
            major, minor = torch.cuda.get_device_capability(device)
            log.info(
                "this GPU (compute capability %d.%d) only emulates bf16: precision auto is fp32", major, minor
            )
    return device, dtype


def wrap_for_training(
    model: nn.Module, config: TrainerConfig, world: WorldEnv, device: torch.device
) -> nn.Module:
    """The module the training steps call: DDP in a group (its construction broadcasts rank 0's parameters,
    a collective, so every rank wraps after resuming), compiled when asked.

    Validation and checkpoints keep using the plain `model`: the wrapper adds nothing to its state.
    """
    network = model
    if world.distributed:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [device.index] if device.type == "cuda" else None
        network = DistributedDataParallel(model, device_ids=device_ids)
    if config.compile:
        network = torch.compile(network)  # type: ignore[assignment]
    return network
