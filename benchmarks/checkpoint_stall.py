"""Checkpoint stall benchmark (issue 13): how long a checkpoint stops the training loop, written
synchronously (serialise + fsync + rename + digest on the loop thread) or in the background (copy the
state on the loop thread, write it on the checkpointer's writer thread), on a realistic model.

Measured, with the trainer's own `Checkpointer`, model builder and optimiser:
1. the training step alone (median over `--steps` steps: the yardstick);
2. synchronous `save`: the loop is stopped for the whole write;
3. `save_in_background`: the loop is stopped for the copy; the `--steps-between` steps that follow run
   while the writer works (their median shows what the writer costs the loop on a small machine), then
   `wait` shows what was still left of the write;
4. the clock trigger's collective: one flag broadcast from rank 0 between 2 gloo processes, per call and
   per training step (it runs every `checkpoint_trigger.CLOCK_CHECK_STEPS` steps).

    python benchmarks/checkpoint_stall.py                  # resnet18 (11M parameters), 5 checkpoints each
    python benchmarks/checkpoint_stall.py --model resnet_small --checkpoints 3

Results (figures plus machine info) go to benchmarks/results/checkpoint-stall[-<model>].{json,md}; the
checkpoints themselves to a temporary directory under --dir (default: the repository's out/, on disk).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from kubetrain_trainer import models, optim
from kubetrain_trainer.checkpoint_trigger import CLOCK_CHECK_STEPS
from kubetrain_trainer.checkpoints import Checkpointer
from kubetrain_trainer.components.training_state import TrainState
from kubetrain_trainer.config import OptimizerConfig

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def _max_ms(values: list[float]) -> float:
    return round(max(values) * 1000, 1)


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _training_step(model_name: str, batch: int) -> tuple[Callable[[], None], dict[str, Any], int]:
    """A step function of the trainer's model and optimiser, the components a checkpoint holds, and
    the parameter count."""
    torch.manual_seed(0)
    model = models.build(model_name, 10, 32).to(memory_format=torch.channels_last)
    optimizer = optim.build_optimizer(
        model, OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    )
    images = torch.randn(batch, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (batch,))
    criterion = torch.nn.CrossEntropyLoss()
    state = TrainState()

    def step() -> None:
        loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        state.step += 1

    components = {"model": model, "optimizer": optimizer, "state": state}
    return step, components, sum(p.numel() for p in model.parameters())


def measure_stalls(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    step, components, parameters = _training_step(args.model, args.batch)
    for _ in range(3):  # warm-up: allocator, first-touch of the optimiser's momentum buffers
        step()
    step_times = [_timed(step) for _ in range(args.steps)]

    sync = Checkpointer(directory / "sync", keep=2)
    sync_stalls = []
    for i in range(args.checkpoints):
        step()
        sync_stalls.append(_timed(lambda i=i: sync.save(1, i + 1, components, {})))
    size = sync.candidates()[0][1].stat().st_size

    background = Checkpointer(directory / "background", keep=2)
    copy_stalls, steps_while_writing, waits = [], [], []
    for i in range(args.checkpoints):
        step()
        copy_stalls.append(_timed(lambda i=i: background.save_in_background(1, i + 1, components, {})))
        steps_while_writing += [_timed(step) for _ in range(args.steps_between)]
        waits.append(_timed(background.wait))
    return {
        "model": args.model,
        "parameters": parameters,
        "checkpoint_mb": round(size / 2**20, 1),
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "checkpoints": args.checkpoints,
        "step_ms_median": _median_ms(step_times),
        "sync_stall_ms_median": _median_ms(sync_stalls),
        "sync_stall_ms_max": _max_ms(sync_stalls),
        "background_stall_ms_median": _median_ms(copy_stalls),
        "background_stall_ms_max": _max_ms(copy_stalls),
        "step_ms_median_while_writing": _median_ms(steps_while_writing),
        "steps_between": args.steps_between,
        "write_left_after_those_steps_ms_median": _median_ms(waits),
    }


def _flag_rank(rank: int, store_path: str, calls: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    flag = torch.zeros(1, dtype=torch.int64)
    for _ in range(50):
        dist.broadcast(flag, src=0)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        dist.broadcast(flag, src=0)
        bool(flag.item())
        times.append(time.perf_counter() - started)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def measure_flag(calls: int, directory: Path) -> dict[str, Any]:
    """The clock trigger's broadcast between two gloo processes on this machine."""
    out = directory / "flag.json"
    mp.spawn(_flag_rank, args=(str(directory / "store"), calls, str(out)), nprocs=2, join=True)
    times = json.loads(out.read_text())
    per_call = statistics.median(times)
    return {
        "backend": "gloo, 2 processes",
        "calls": calls,
        "flag_broadcast_us_median": round(per_call * 1e6, 1),
        "flag_broadcast_us_p90": round(sorted(times)[int(0.9 * len(times))] * 1e6, 1),
        "clock_check_steps": CLOCK_CHECK_STEPS,
        "per_training_step_us": round(per_call * 1e6 / CLOCK_CHECK_STEPS, 2),
    }


def machine() -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_average_1m_at_start": round(os.getloadavg()[0], 1),
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "note": "2 cores shared with other engineers' work: the load average says how busy they were",
    }


def markdown(result: dict[str, Any]) -> str:
    s, f, m = result["stall"], result["flag"], result["machine"]
    rows = [
        ("training step (the yardstick)", s["step_ms_median"], ""),
        (
            "loop stall, synchronous save (serialise + fsync + rename + digest)",
            s["sync_stall_ms_median"],
            s["sync_stall_ms_max"],
        ),
        (
            "loop stall, background save (copy of the state)",
            s["background_stall_ms_median"],
            s["background_stall_ms_max"],
        ),
        ("training step while the writer thread works", s["step_ms_median_while_writing"], ""),
        (
            f"write still running after {s['steps_between']} steps (`wait`)",
            s["write_left_after_those_steps_ms_median"],
            "",
        ),
    ]
    table = "\n".join(f"| {name} | {mid} ms | {f'{top} ms' if top else ''} |" for name, mid, top in rows)
    size = f"{s['parameters'] / 1e6:.1f}M parameters, {s['checkpoint_mb']} MB"
    ratio = s["sync_stall_ms_median"] / max(s["background_stall_ms_median"], 0.1)
    return f"""# Checkpoint stall: {s["model"]}, {size}

Machine: {m["cores"]} cores ({m["cpu"]}), load average {m["load_average_1m_at_start"]} at start (shared
with other work), torch {m["torch"]}, {m["date"]}. CPU training, batch {s["batch"]}, {s["threads"]}
threads, {s["checkpoints"]} checkpoints per mode. Produced by `benchmarks/checkpoint_stall.py`.

| | median | max |
| --- | --- | --- |
{table}

The background save pauses the loop {ratio:.1f}x less than the synchronous one (medians); the rest of
the write overlaps training.

Clock-trigger agreement: one flag broadcast ({f["backend"]}) takes {f["flag_broadcast_us_median"]} us
(p90 {f["flag_broadcast_us_p90"]} us); read every {f["clock_check_steps"]} steps that is
{f["per_training_step_us"]} us per training step.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default="resnet18", choices=["simple_cnn", "resnet_small", "resnet18"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="steps timed alone (the yardstick)")
    parser.add_argument("--checkpoints", type=int, default=5, help="checkpoints timed per mode")
    parser.add_argument("--steps-between", type=int, default=5, help="steps timed after a background save")
    parser.add_argument("--flag-calls", type=int, default=2000)
    parser.add_argument("--dir", type=Path, default=REPO / "out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.dir.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="checkpoint-stall-", dir=args.dir))
    try:
        result = {"machine": machine(), "stall": measure_stalls(args, directory)}
        result["flag"] = measure_flag(args.flag_calls, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    suffix = "" if args.model == "resnet18" else f"-{args.model}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"checkpoint-stall{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / f"checkpoint-stall{suffix}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
