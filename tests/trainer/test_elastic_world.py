"""An elastic group's world (PET_NNODES=MIN:MAX): any world size within it, one global batch for all."""

from __future__ import annotations

import pytest
from kubetrain_trainer import distributed
from kubetrain_trainer.failures import ConfigError

pytestmark = pytest.mark.unit


def _world(world_size: int, nnodes: str = "2:3", local_world_size: int = 1) -> distributed.WorldEnv:
    return distributed.read_world_env(
        {
            "WORLD_SIZE": str(world_size),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": str(local_world_size),
            "PET_NNODES": nnodes,
            "PET_NPROC_PER_NODE": str(local_world_size),
            "MASTER_ADDR": "10.0.0.1",
        }
    )


@pytest.mark.parametrize(
    ("world_size", "local_world_size", "per_rank", "global_batch"),
    [(3, 1, 32, 96), (2, 1, 48, 96), (1, 1, 96, 96), (4, 2, 48, 192), (6, 2, 32, 192)],
)
def test_an_elastic_group_keeps_its_global_batch_at_every_world_size(
    world_size: int, local_world_size: int, per_rank: int, global_batch: int
) -> None:
    world = _world(world_size, "1:3", local_world_size)
    assert world.max_nodes == 3
    assert world.per_rank_batch(32) == per_rank
    assert world.per_rank_batch(32) * world_size == global_batch


def test_a_global_batch_the_world_size_does_not_divide_is_rounded_down_to_equal_shares() -> None:
    world = _world(2, "1:3")
    assert world.per_rank_batch(5) == 7, "15 images wanted: 2 ranks take 7 each"


def test_a_fixed_size_group_uses_batch_size_per_rank() -> None:
    world = _world(2, "2")
    assert world.max_nodes is None and world.per_rank_batch(32) == 32


def test_a_malformed_nnodes_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"PET_NNODES='2:x' is not N or MIN:MAX"):
        _world(2, "2:x")
