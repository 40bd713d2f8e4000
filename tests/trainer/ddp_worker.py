"""One rank of a test training group that also saves its own final weights as `<job dir>/rank<R>.pt`.

The CLI only writes rank 0's model; comparing replicas needs every rank's copy, so this script drives
the same Trainer the CLI does and dumps `model.state_dict()` afterwards.
"""

from __future__ import annotations

import os

import torch
from kubetrain_trainer import config_loading, distributed, logging_setup
from kubetrain_trainer.trainer import build_trainer


def main() -> None:
    world = distributed.read_world_env()
    logging_setup.configure(world.rank)
    config = config_loading.load_config(None, {})
    distributed.init_process_group(world, "gloo", 60, 120)
    try:
        trainer = build_trainer(config, world, os.environ["KUBETRAIN_JOB_NAME"])
        trainer.train()
        # Rank 0 creates the job directory when it saves; another rank may get here first.
        trainer.job_dir.mkdir(parents=True, exist_ok=True)
        torch.save(trainer.model.state_dict(), trainer.job_dir / f"rank{world.rank}.pt")
    finally:
        distributed.destroy_process_group()


if __name__ == "__main__":
    main()
