"""Copies of training state that the loop may keep mutating while a background thread writes them.

A checkpoint is taken in two halves: this copy on the training thread (a memory copy: milliseconds), then
serialisation, fsync and digest on a writer thread (seconds for a large model) while training goes on.
"""

from __future__ import annotations

from typing import Any

import torch


def cpu_copy(state: Any) -> Any:
    """`state` with every tensor copied to the CPU and every dict, list and tuple rebuilt.

    The containers are rebuilt too because the loop changes them in place (the optimiser's `lr` in its
    parameter groups); plain values (numbers, strings) are immutable and shared.
    """
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {key: cpu_copy(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(cpu_copy(value) for value in state)
    return state
