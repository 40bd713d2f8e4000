"""Exceptions that carry their exit code, and the mapping of torch's own failures onto exit codes.

The operator restarts or fails a TrainingJob from the exit code alone, so every failure the trainer can
name must reach `cli.main` as a `TrainerError` or be classified here; anything else exits 1 (retryable).
"""

from __future__ import annotations

from kubetrain_trainer.exit_codes import ExitCode


class TrainerError(Exception):
    """A failure with a known class; `message` is printed as the pod's last log line."""

    exit_code: ExitCode = ExitCode.UNEXPECTED_ERROR


class ConfigError(TrainerError):
    """Invalid configuration, arguments or environment: permanent."""

    exit_code = ExitCode.BAD_CONFIG


class DataError(TrainerError):
    """Missing, unreadable or corrupt data: permanent."""

    exit_code = ExitCode.DATA_ERROR


class RendezvousTimeoutError(TrainerError):
    """The master stayed unreachable for the whole rendezvous timeout: retryable."""

    exit_code = ExitCode.RENDEZVOUS_TIMEOUT


class PeerLostError(TrainerError):
    """Another rank failed and said so (`peer_failure`): this one left the group instead of waiting for it
    in a collective; retryable."""

    exit_code = ExitCode.PEER_LOST


class SupersededError(TrainerError):
    """A newer restart attempt of this TrainingJob has written a checkpoint: this process is a leftover of
    an attempt the operator replaced (say on a node cut off from the API server) and stops, as if it had
    been sent the SIGTERM that could not reach it (`checkpoints`)."""

    exit_code = ExitCode.INTERRUPTED


_PEER_LOST_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "connection refused",
    "socket timeout",
    "timed out",
    "nccl communicator was aborted",
    "ncclremoteerror",
)


def classify(error: BaseException) -> ExitCode:
    """Exit code for any exception, so that torch errors that mean "retry elsewhere" are retried.

    torch raises plain RuntimeError for many collective failures (gloo reports a dead peer as
    "Connection closed by peer"), hence the message markers next to the exception types.
    """
    if isinstance(error, TrainerError):
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    if isinstance(error, MemoryError):
        return ExitCode.OUT_OF_MEMORY
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return ExitCode.OUT_OF_MEMORY
    if isinstance(error, torch.distributed.DistError):
        return ExitCode.PEER_LOST
    if isinstance(error, RuntimeError):
        text = str(error).lower()
        if "out of memory" in text:
            return ExitCode.OUT_OF_MEMORY
        if any(marker in text for marker in _PEER_LOST_MARKERS):
            return ExitCode.PEER_LOST
    return ExitCode.UNEXPECTED_ERROR
