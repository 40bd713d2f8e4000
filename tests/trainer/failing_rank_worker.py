"""`kubetrain train` as one rank of a group in which rank 0 alone fails: its background checkpoint write
raises (a full disk), and then it lingers `TEST_LINGER_SECONDS` before leaving the process group.

The linger stands in for NCCL, which may never notice that a peer left: over gloo a failed rank's closed
sockets end its peers' collectives at once, so without it this test could not tell an announced failure
from a noticed exit.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import torch
from kubetrain_trainer import cli, distributed


def _fail_checkpoint_writes() -> None:
    save = torch.save

    def save_or_fail(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if threading.current_thread().name.startswith("checkpoint-writer"):
            raise OSError(28, "No space left on device")
        save(obj, f, *args, **kwargs)

    torch.save = save_or_fail


def _linger_before_leaving(seconds: float) -> None:
    destroy = distributed.destroy_process_group

    def linger_then_destroy() -> None:
        print(f"LEAVING_AT {time.time():.3f}", flush=True)
        time.sleep(seconds)
        destroy()

    distributed.destroy_process_group = linger_then_destroy


if __name__ == "__main__":
    if os.environ["RANK"] == "0":
        _fail_checkpoint_writes()
        _linger_before_leaving(float(os.environ["TEST_LINGER_SECONDS"]))
    sys.exit(cli.main(["train"]))
