"""Failures map onto the documented exit codes the operator's restart rules read."""

from __future__ import annotations

import pytest
import torch
from kubetrain_trainer.exit_codes import PERMANENT_EXIT_CODES, ExitCode
from kubetrain_trainer.failures import ConfigError, DataError, RendezvousTimeoutError, classify

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.7]:4123"), 11),
        (torch.distributed.DistBackendError("NCCL communicator was aborted"), 11),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), 12),
        (MemoryError(), 12),
        (KeyboardInterrupt(), 130),
        (RendezvousTimeoutError("master unreachable"), 10),
        (ValueError("something else"), 1),
    ],
)
def test_torch_and_trainer_failures_get_their_exit_codes(error: BaseException, expected: int) -> None:
    assert classify(error) == expected


def test_only_config_and_data_errors_are_permanent() -> None:
    assert classify(ConfigError("x")) in PERMANENT_EXIT_CODES
    assert classify(DataError("x")) in PERMANENT_EXIT_CODES
    assert ExitCode.PEER_LOST not in PERMANENT_EXIT_CODES
