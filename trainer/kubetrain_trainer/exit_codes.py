"""Exit codes of `kubetrain train`, shared with the operator's failure rules.

The operator restarts the whole worker group for retryable codes and fails the TrainingJob at once for
permanent ones, so a code must only be added here together with its class.
"""

from enum import IntEnum


class ExitCode(IntEnum):
    """Why a trainer process ended. Values are part of the public contract: never renumber."""

    SUCCESS = 0
    UNEXPECTED_ERROR = 1
    """An unclassified exception; retried, because most are transient on real clusters."""
    BAD_CONFIG = 2
    """The configuration or CLI arguments are invalid; retrying cannot help."""
    DATA_ERROR = 3
    """The dataset is missing, unreadable or corrupt; retrying cannot help."""
    RENDEZVOUS_TIMEOUT = 10
    """The master could not be reached before the rendezvous timeout."""
    PEER_LOST = 11
    """A collective failed because another rank died or the network broke."""
    OUT_OF_MEMORY = 12
    """The device or host ran out of memory; another node or a restart may succeed."""
    INTERRUPTED = 130
    """SIGINT/SIGTERM: the pod was deleted or the group is being torn down; or a newer restart attempt
    has written a checkpoint, so this process belongs to a replaced attempt and stops
    (`failures.SupersededError`)."""


PERMANENT_EXIT_CODES: tuple[int, ...] = (ExitCode.BAD_CONFIG, ExitCode.DATA_ERROR)
"""Codes that fail a TrainingJob without a restart (the operator's default failure rule)."""
