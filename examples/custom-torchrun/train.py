"""A user's own DDP script, unaware of kubetrain: torchrun gives it RANK, LOCAL_RANK and WORLD_SIZE.

It fits y = 3x + 1 on synthetic data split across ranks and writes the learned weights from rank 0.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    x = torch.rand(256, 1)
    y = 3 * x + 1
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        weights = {"weight": model.module.weight.item(), "bias": model.module.bias.item()}
        result = {
            "world_size": world,
            "loss": loss.item(),
            **weights,
            "node_rank": os.environ.get("NODE_RANK"),
        }
        (args.out / "result.json").write_text(json.dumps(result))
        print(f"rank 0 of {world}: loss {loss.item():.4f} {weights}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
