"""Polling for a condition of the cluster, with an explanation when it never comes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any],
    what: str,
    timeout: float = 60.0,
    *,
    interval: float = 0.3,
    explain: Callable[[], str] | None = None,
) -> Any:
    """Return the first truthy value of `predicate`; fail naming `what` (and `explain()`) after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    detail = f"\n{explain()}" if explain is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
