"""One rank of a 2-process gloo group whose collective never completes, for test_heartbeat.

Rank 0 starts the heartbeat from its environment (KUBETRAIN_HEARTBEAT_SECONDS, the pod annotator being
`HEARTBEAT_TEST_API` with the token file `HEARTBEAT_TEST_TOKEN`), makes progress up to step 3 and then
blocks in an all_reduce that rank 1 never joins: a hung collective. Rank 1 joins the group and sleeps
until it is killed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from kubetrain_trainer import distributed, heartbeat, logging_setup
from kubetrain_trainer.progress import PodAnnotator


def main() -> None:
    world = distributed.read_world_env()
    logging_setup.configure(world.rank)
    distributed.init_process_group(world, "gloo", 60, 600)
    if world.rank != 0:
        time.sleep(600)
        return
    tick = heartbeat.ProgressTick()
    for step in (1, 2, 3):
        tick(step)
    annotator = PodAnnotator(
        os.environ["HEARTBEAT_TEST_API"],
        "team-a",
        "job-worker-0",
        Path(os.environ["HEARTBEAT_TEST_TOKEN"]),
        None,
    )
    if heartbeat.start(world, tick, annotator) is None:
        raise SystemExit("no heartbeat started")
    print("blocking in all_reduce", flush=True)
    torch.distributed.all_reduce(torch.zeros(1))
    print("all_reduce returned", flush=True)


if __name__ == "__main__":
    main()
