"""One trainer process's data path, measured: prints the memory check's predicted peak, the old check's
figure and the process's measured peak resident memory (VmHWM) after loading the data and one epoch of
batches, as JSON. Run by test_memory_peak.py: `python memory_peak_worker.py CONFIG_JSON`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from kubetrain_trainer import memory
from kubetrain_trainer.components import training_data
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.distributed import WorldEnv


def peak_resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    config = TrainerConfig.model_validate(json.loads(sys.argv[1]))
    world = WorldEnv(rank=0, world_size=1, local_rank=0, local_world_size=1)
    torch.set_num_threads(1)
    memory.return_freed_buffers()  # as `kubetrain train` does at start
    budget = training_data.data_budget(config, world)
    data = training_data.load_training_data(config, world, torch.device("cpu"))
    for _images, _labels in data.loader:
        pass
    images = len(data.train) + len(data.validation)
    decoded = images * budget.image_bytes
    old = 2 * decoded + (images * 3 * (config.data.image_size + 8) ** 2 if config.augment else 0)
    print(
        json.dumps(
            {
                "predicted": budget.memory_peak(images),
                "baseline": budget.baseline_bytes,
                "old_predicted": old,
                "measured": peak_resident_bytes(),
                "mapped": not data.loader.resident,
            }
        )
    )


if __name__ == "__main__":
    main()
