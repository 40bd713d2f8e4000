"""Process-group life cycle: read the worker environment, check it, rendezvous with retries, tear down.

Workers routinely start before the master's Service resolves, so the rendezvous retries until
`rendezvous_timeout_seconds` and only then fails with the retryable exit code 10.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

from kubetrain_trainer import contract
from kubetrain_trainer.failures import ConfigError, RendezvousTimeoutError
from kubetrain_trainer.peer_failure import PeerFailureWatch

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
"""Set to "True" by torchrun for its worker processes (several processes per pod)."""

T = TypeVar("T")

_CONNECT_ATTEMPT_SECONDS = 2.0
"""Each connection attempt to the master waits this long: a master appearing late is seen within seconds."""

_watch: PeerFailureWatch | None = None
"""This process's watch for another rank's failure while it is in a group (`peer_failure`)."""


@dataclass(frozen=True)
class WorldEnv:
    """This process's place in the training group, as the operator (or torchrun) set it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    agent_store: bool = False
    """True under torchrun: its agent already hosts the store at MASTER_ADDR:MASTER_PORT for every rank."""
    max_nodes: int | None = None
    """An elastic group's most workers (PET_NNODES=MIN:MAX); None for a fixed-size group."""

    def per_rank_batch(self, batch_size: int) -> int:
        """This rank's batch: `batch_size` in a fixed-size group. An elastic group keeps its global batch
        at batch_size x the largest world size (maxWorkers x LOCAL_WORLD_SIZE) whatever the current one,
        so the learning rate and its schedule mean the same after every re-rendezvous; each rank takes an
        equal share, the global batch rounded down to a multiple of the world size (at most WORLD_SIZE-1
        images fewer)."""
        if self.max_nodes is None:
            return batch_size
        return max(1, batch_size * self.max_nodes * self.local_world_size // self.world_size)

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


def _read_nnodes(env: Mapping[str, str]) -> tuple[int, int] | None:
    """PET_NNODES as (min, max): `N` for a fixed-size group, `MIN:MAX` for an elastic one (torchrun's
    --nnodes syntax; the world size within it is whatever the last rendezvous round gathered)."""
    raw = env.get(contract.PET_NNODES)
    if raw is None or raw == "":
        return None
    low, _, high = raw.partition(":")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise ConfigError(f"environment variable {contract.PET_NNODES}={raw!r} is not N or MIN:MAX") from None


def read_world_env(env: Mapping[str, str] | None = None) -> WorldEnv:
    """Parse and cross-check the worker environment, naming every factor when they disagree."""
    env = os.environ if env is None else env
    world_size = _read_int(env, contract.WORLD_SIZE, 1)
    rank = _read_int(env, contract.RANK, 0)
    local_world_size = _read_int(env, contract.LOCAL_WORLD_SIZE, 1)
    local_rank = _read_int(env, contract.LOCAL_RANK, 0)
    node_rank = _read_int(env, contract.NODE_RANK, None)
    nnodes_range = _read_nnodes(env)
    max_nodes = nnodes_range[1] if nnodes_range and nnodes_range[0] != nnodes_range[1] else None
    nnodes = None if nnodes_range is None or max_nodes is not None else nnodes_range[0]
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
            f"PET_NNODES({nnodes}) * PET_NPROC_PER_NODE({nproc}) = {nnodes * nproc} "
            f"!= WORLD_SIZE({world_size})"
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
        agent_store=env.get(TORCHELASTIC_USE_AGENT_STORE) == "True",
        max_nodes=max_nodes,
    )


def _probe(host: str, port: int, timeout: float) -> None:
    """Open and close one TCP connection: raises OSError while DNS or the port is not ready yet."""
    with socket.create_connection((host, port), timeout=timeout):
        pass


def wait_for_master(world: WorldEnv, timeout_seconds: float) -> None:
    """Retry reaching MASTER_ADDR:MASTER_PORT until it answers, or raise RendezvousTimeoutError.

    A plain socket probe (rather than repeated TCPStore constructions) keeps pod logs to one line per
    few attempts while a master's Service name does not resolve yet or its port is not open yet.
    """
    deadline = time.monotonic() + timeout_seconds
    attempt = 0
    while True:
        attempt += 1
        try:
            _probe(world.master_addr, world.master_port, _CONNECT_ATTEMPT_SECONDS)
            return
        except OSError as error:
            last_error = error
        if time.monotonic() >= deadline:
            raise RendezvousTimeoutError(
                f"rendezvous timed out after {timeout_seconds:.0f}s and {attempt} attempts: master "
                f"{world.master_addr}:{world.master_port} unreachable from rank {world.rank} (last error: "
                f"{last_error}); check that the master pod is running and MASTER_ADDR/MASTER_PORT point to it"
            )
        if attempt == 1 or attempt % 10 == 0:  # a warning: ranks other than 0 only log warnings
            log.warning(
                "waiting for master %s:%s (rank %d, attempt %d): %s",
                world.master_addr,
                world.master_port,
                world.rank,
                attempt,
                last_error,
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def connect_store(world: WorldEnv, timeout_seconds: float) -> torch.distributed.TCPStore:
    """Open the rendezvous store: rank 0 hosts it, the others first wait until the master answers."""
    import torch.distributed as dist

    started = time.monotonic()
    if not world.is_main:
        wait_for_master(world, timeout_seconds)
    remaining = max(1.0, timeout_seconds - (time.monotonic() - started))
    try:
        return dist.TCPStore(
            world.master_addr,
            world.master_port,
            world.world_size,
            is_master=world.is_main,
            timeout=timedelta(seconds=remaining),
            wait_for_workers=False,
        )
    except dist.DistNetworkError as error:
        if world.is_main:
            raise ConfigError(
                f"rank 0 cannot listen on MASTER_PORT({world.master_port}): {str(error).splitlines()[0]}"
            ) from error
        raise RendezvousTimeoutError(
            f"rendezvous failed: master {world.master_addr}:{world.master_port} answered but its store "
            f"did not within {timeout_seconds:.0f}s ({str(error).splitlines()[0]})"
        ) from error


def init_process_group(
    world: WorldEnv, backend: str, rendezvous_timeout_seconds: float, collective_timeout_seconds: float
) -> None:
    """Join the group through a store that was reached with retries; no-op for a single process.

    Under torchrun the agents have already met (torchrun retries its own rendezvous), and rank 0 must not
    host a second store on the agent's port: `env://` makes every rank a client of the agent's store.
    """
    if not world.distributed:
        return
    import torch.distributed as dist

    timeout = timedelta(seconds=collective_timeout_seconds)
    if world.agent_store:
        dist.init_process_group(
            backend, init_method="env://", rank=world.rank, world_size=world.world_size, timeout=timeout
        )
        log.info(
            "joined torchrun process group: rank %d of %d, backend %s",
            world.rank,
            world.world_size,
            backend,
        )
        _start_watch(world)
        return
    store = connect_store(world, rendezvous_timeout_seconds)
    store.set_timeout(timedelta(seconds=rendezvous_timeout_seconds))
    try:
        dist.init_process_group(
            backend, store=store, rank=world.rank, world_size=world.world_size, timeout=timeout
        )
    except dist.DistStoreError as error:
        raise RendezvousTimeoutError(
            f"rendezvous timed out after {rendezvous_timeout_seconds:.0f}s: not all WORLD_SIZE("
            f"{world.world_size}) processes joined at {world.master_addr}:{world.master_port} ({error})"
        ) from error
    log.info("joined process group: rank %d of %d, backend %s", world.rank, world.world_size, backend)
    _start_watch(world)


def _start_watch(world: WorldEnv) -> None:
    """Watch the group's store for another rank's failure (`peer_failure`); a store that cannot be watched
    leaves the group as it was before the watch existed, with a warning."""
    global _watch  # noqa: PLW0603 - one watch per process, like the default process group it belongs to
    from torch.distributed import distributed_c10d

    try:
        _watch = PeerFailureWatch(world.rank, world.world_size, distributed_c10d._get_default_store())
    except Exception as error:
        log.warning("not watching for other ranks' failures: %s", error)


def announce_failure(reason: str) -> None:
    """Tell the other ranks that this one failed, so they leave the group at once (`peer_failure`); nothing
    outside a group."""
    if _watch is not None:
        _watch.announce(reason)


def peer_failure() -> str | None:
    """Another rank's announced failure, when this rank left the group because of it."""
    return _watch.failure if _watch is not None else None


def destroy_process_group() -> None:
    """Leave the group if one exists; called on every exit path so sockets and NCCL state are freed."""
    import torch.distributed as dist

    if _watch is not None:
        _watch.stop()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor, world: WorldEnv) -> torch.Tensor:
    """`values` summed in place over all ranks: loss totals and confusion matrices are added before dividing,
    so every rank reports the whole group's figure. A collective: every rank calls it at the same point."""
    if world.distributed:
        import torch.distributed as dist

        dist.all_reduce(values)
    return values


def barrier(world: WorldEnv) -> None:
    """Wait until every rank gets here (a collective); nothing for a single process. NCCL is told this
    rank's GPU, which it would otherwise have to guess."""
    if not world.distributed:
        return
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def in_turns(world: WorldEnv, action: Callable[[], T]) -> T:
    """`action()` on every rank, one turn after another with a barrier (`barrier`) between the turns: rank 0
    first, then the first process (LOCAL_RANK 0) of every other worker, then the rest.

    For work that fills a shared place once, such as a dataset download into the data root: rank 0 does it
    while the others wait, so they find the files in place on a volume shared by all workers; on a volume
    per worker each worker's first process does it once more. Turns nobody has (a single worker, one
    process per worker) are skipped alike on every rank, since every worker runs LOCAL_WORLD_SIZE processes.
    A collective: every rank calls it at the same point.
    """
    if not world.distributed:
        return action()
    turns = [0]
    if world.world_size > world.local_world_size:
        turns.append(1)
    if world.local_world_size > 1:
        turns.append(2)
    mine = 0 if world.is_main else 1 if world.local_rank == 0 else 2
    result: list[T] = []
    for index, turn in enumerate(turns):
        if turn == mine:
            result.append(action())
        if index < len(turns) - 1:
            barrier(world)
    return result[0]
