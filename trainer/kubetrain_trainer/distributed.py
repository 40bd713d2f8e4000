"""Process-group life cycle: read the worker environment, check it, rendezvous with retries, tear down.

Workers routinely start before the master's Service resolves, so the rendezvous retries until
`rendezvous_timeout_seconds` and only then fails with the retryable exit code 10.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from kubetrain_trainer import contract
from kubetrain_trainer.failures import ConfigError, RendezvousTimeout

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

_CONNECT_ATTEMPT_SECONDS = 5.0
"""Each TCPStore connection attempt waits this long, so DNS appearing late is noticed within seconds."""


@dataclass(frozen=True)
class WorldEnv:
    """This process's place in the training group, as the operator (or torchrun) set it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @property
    def distributed(self) -> bool:
        """Whether a process group is needed at all (a single process trains without one)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes checkpoints, artifacts and progress."""
        return self.rank == 0


def _read_int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def read_world_env(env: Mapping[str, str] | None = None) -> WorldEnv:
    """Parse and cross-check the worker environment, naming every factor when they disagree."""
    env = os.environ if env is None else env
    world_size = _read_int(env, contract.WORLD_SIZE, 1)
    rank = _read_int(env, contract.RANK, 0)
    local_world_size = _read_int(env, contract.LOCAL_WORLD_SIZE, 1)
    local_rank = _read_int(env, contract.LOCAL_RANK, 0)
    node_rank = _read_int(env, contract.NODE_RANK, None)
    nnodes = _read_int(env, contract.PET_NNODES, None)
    nproc = _read_int(env, contract.PET_NPROC_PER_NODE, None)
    assert world_size is not None and rank is not None
    assert local_world_size is not None and local_rank is not None
    problems = []
    if world_size < 1:
        problems.append(f"WORLD_SIZE({world_size}) must be at least 1")
    if not 0 <= rank < world_size:
        problems.append(f"RANK({rank}) must be in [0, WORLD_SIZE({world_size}))")
    if not 0 <= local_rank < local_world_size:
        problems.append(f"LOCAL_RANK({local_rank}) must be in [0, LOCAL_WORLD_SIZE({local_world_size}))")
    if local_world_size > world_size or world_size % local_world_size:
        problems.append(
            f"WORLD_SIZE({world_size}) is not a multiple of LOCAL_WORLD_SIZE({local_world_size}): "
            "every worker must run the same number of processes"
        )
    if nnodes is not None and nproc is not None and nnodes * nproc != world_size:
        problems.append(
            f"PET_NNODES({nnodes}) * PET_NPROC_PER_NODE({nproc}) = {nnodes * nproc} != WORLD_SIZE({world_size})"
        )
    if node_rank is not None and node_rank * local_world_size + local_rank != rank:
        problems.append(
            f"NODE_RANK({node_rank}) * LOCAL_WORLD_SIZE({local_world_size}) + LOCAL_RANK({local_rank}) = "
            f"{node_rank * local_world_size + local_rank} != RANK({rank})"
        )
    if problems:
        raise ConfigError("inconsistent worker environment: " + "; ".join(problems))
    port = _read_int(env, contract.MASTER_PORT, 29500)
    assert port is not None
    if world_size > 1 and contract.MASTER_ADDR not in env:
        raise ConfigError(f"WORLD_SIZE({world_size}) > 1 but MASTER_ADDR is not set")
    return WorldEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        master_addr=env.get(contract.MASTER_ADDR, "127.0.0.1"),
        master_port=port,
    )


def connect_store(world: WorldEnv, timeout_seconds: float) -> torch.distributed.TCPStore:
    """Open the rendezvous store, retrying until the master answers or `timeout_seconds` pass.

    Rank 0 hosts the store; other ranks retry short connection attempts so that a master whose DNS name
    does not resolve yet, or whose port is not open yet, is picked up as soon as it appears.
    """
    import torch.distributed as dist

    deadline = time.monotonic() + timeout_seconds
    attempt = 0
    last_error: Exception | None = None
    while True:
        attempt += 1
        remaining = deadline - time.monotonic()
        wait = max(1.0, min(_CONNECT_ATTEMPT_SECONDS, remaining))
        try:
            return dist.TCPStore(
                world.master_addr,
                world.master_port,
                world.world_size,
                is_master=world.is_main,
                timeout=timedelta(seconds=wait if not world.is_main else timeout_seconds),
                wait_for_workers=False,
            )
        except Exception as error:  # DNS failures, refused connections and store timeouts alike
            last_error = error
        if time.monotonic() >= deadline:
            raise RendezvousTimeout(
                f"rendezvous timed out after {timeout_seconds:.0f}s and {attempt} attempts: master "
                f"{world.master_addr}:{world.master_port} unreachable from rank {world.rank} "
                f"(last error: {str(last_error).splitlines()[0] if last_error else 'none'})"
            )
        if attempt == 1 or attempt % 6 == 0:
            log.info(
                "waiting for master %s:%s (rank %d, attempt %d): %s",
                world.master_addr,
                world.master_port,
                world.rank,
                attempt,
                str(last_error).splitlines()[0] if last_error else "",
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def init_process_group(
    world: WorldEnv, backend: str, rendezvous_timeout_seconds: float, collective_timeout_seconds: float
) -> None:
    """Join the group through a store that was reached with retries; no-op for a single process."""
    if not world.distributed:
        return
    import torch.distributed as dist

    store = connect_store(world, rendezvous_timeout_seconds)
    store.set_timeout(timedelta(seconds=rendezvous_timeout_seconds))
    try:
        dist.init_process_group(
            backend,
            store=store,
            rank=world.rank,
            world_size=world.world_size,
            timeout=timedelta(seconds=collective_timeout_seconds),
        )
    except dist.DistStoreError as error:
        raise RendezvousTimeout(
            f"rendezvous timed out after {rendezvous_timeout_seconds:.0f}s: not all WORLD_SIZE("
            f"{world.world_size}) processes joined at {world.master_addr}:{world.master_port} ({error})"
        ) from error
    log.info("joined process group: rank %d of %d, backend %s", world.rank, world.world_size, backend)


def destroy_process_group() -> None:
    """Leave the group if one exists; called on every exit path so sockets and NCCL state are freed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
