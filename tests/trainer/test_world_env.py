"""The worker environment is cross-checked and the rendezvous gives up with exit code 10 in time."""

from __future__ import annotations

import time

import pytest
from kubetrain_trainer import distributed
from kubetrain_trainer.exit_codes import ExitCode
from kubetrain_trainer.failures import ConfigError, RendezvousTimeoutError
from testcluster.processes import free_port

pytestmark = pytest.mark.unit


def test_consistent_torchrun_environment_is_accepted() -> None:
    world = distributed.read_world_env(
        {
            "WORLD_SIZE": "4",
            "RANK": "3",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "NODE_RANK": "1",
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "2",
            "MASTER_ADDR": "job-master-0",
            "MASTER_PORT": "23456",
        }
    )
    assert (world.rank, world.world_size, world.local_rank, world.master_port) == (3, 4, 1, 23456)
    assert world.distributed and not world.is_main


def test_world_size_mismatch_names_every_factor() -> None:
    env = {
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "NODE_RANK": "1",
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "2",
        "MASTER_ADDR": "m",
    }
    with pytest.raises(ConfigError) as raised:
        distributed.read_world_env(env)
    message = str(raised.value)
    for factor in (
        "PET_NNODES(2)",
        "PET_NPROC_PER_NODE(2)",
        "WORLD_SIZE(2)",
        "NODE_RANK(1)",
        "LOCAL_RANK(1)",
    ):
        assert factor in message
    assert raised.value.exit_code == ExitCode.BAD_CONFIG


def test_rank_outside_world_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"RANK\(2\) must be in \[0, WORLD_SIZE\(2\)\)"):
        distributed.read_world_env({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "m"})


def test_unreachable_master_times_out_with_a_retryable_error_naming_it() -> None:
    port = free_port()
    world = distributed.WorldEnv(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port)
    started = time.monotonic()
    with pytest.raises(RendezvousTimeoutError) as raised:
        distributed.wait_for_master(world, timeout_seconds=2)
    assert time.monotonic() - started < 10
    assert f"127.0.0.1:{port}" in str(raised.value)
    assert raised.value.exit_code == ExitCode.RENDEZVOUS_TIMEOUT
