"""Does `compile: true` (torch.compile) make a recipe's training step faster on this CPU? (issue 26)

The budget recipe trains a small network (whitened_cnn, width 32) whose batch norms, GELUs and max-pools
are memory-bound elementwise passes beside the convolutions; fusing them is what torch.compile's inductor
offers, and the speed runs on GPUs use it. This times the recipe's own training step (its model, width,
batch, precision and optimizer, channels_last, on synthetic batches: the speed of a step does not depend
on the pixels) eager and compiled, alternating, in one process: the first steps (a compiled model's
compilation, in a fresh inductor cache) and the img/s of the steps after them. Later compiled rounds
start over (`torch._dynamo.reset`) with the on-disk cache the first one filled, which is what a second
run on the same node would find.

    python benchmarks/trainer_compile.py                       # examples/cifar10-fast.yaml, 2 rounds
    python benchmarks/trainer_compile.py --recipe examples/cifar10-sprint.yaml --tag sprint

Results go to benchmarks/results/trainer-compile-<tag>.{json,md}, with the machine they ran on; run it
alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from kubetrain_trainer import models, optim, precision
from kubetrain_trainer.config import TrainerConfig
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))  # benchmarks/ is not a package
from trainer_speed import RECIPE_FILE, RESULTS, machine_info

ROOT = Path(__file__).resolve().parent.parent
FIRST_STEPS = 3
"""Steps timed as start-up: a compiled model compiles in its first (and recompiles once if the second
sees other guards); eager's are its allocators warming up."""
WARMUP_STEPS = 10
"""Untimed steps between the start-up and the timed ones (as `trainer_speed`'s rate probe)."""


def recipe_config(recipe: Path) -> TrainerConfig:
    """The recipe's trainer config, on this machine's CPU with 2 threads (as the budget benchmark runs it)."""
    spec = yaml.safe_load(recipe.read_text())["spec"]["trainer"]
    return TrainerConfig.model_validate({**spec, "device": "cpu", "cpu_threads": 2})


def time_steps(config: TrainerConfig, compiled: bool, steps: int) -> dict[str, float]:
    """Start-up seconds of the first steps and img/s of `steps` more, for a fresh model and optimizer."""
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    model = models.build(config.model, 10, config.width).to(memory_format=torch.channels_last)
    if isinstance(model, models.WhitenedCNN):
        model.fit_whitening(torch.randn(2048, 3, 32, 32))
    opt = optim.build_optimizer(model, config.optimizer)
    optim.set_lr(opt, 0.01, 1.0)
    forward = torch.compile(model) if compiled else model
    images = torch.randn(config.batch_size, 3, 32, 32).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (config.batch_size,))
    dtype = precision.compute_dtype(config.precision, cpu)

    def step() -> None:
        with precision.autocast(cpu, dtype):
            outputs = forward(images)
        loss = nn.functional.cross_entropy(
            outputs.float(), labels, label_smoothing=config.optimizer.label_smoothing
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    started = time.perf_counter()
    for _ in range(FIRST_STEPS):
        step()
    first = time.perf_counter() - started
    for _ in range(WARMUP_STEPS):
        step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    rate = config.batch_size * steps / (time.perf_counter() - started)
    return {"first_steps_seconds": round(first, 2), "images_per_second": round(rate, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", type=Path, default=RECIPE_FILE)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=2, help="eager-then-compiled pairs")
    parser.add_argument("--tag", default="budget")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args()

    config = recipe_config(args.recipe)
    torch.set_num_threads(config.cpu_threads)
    machine = machine_info()
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # the first compilation is a cold one
        for number in range(1, args.rounds + 1):
            for compiled in (False, True):
                torch._dynamo.reset()
                figures = time_steps(config, compiled, args.steps)
                rounds.append({"round": number, "mode": "compiled" if compiled else "eager", **figures})
                print(json.dumps(rounds[-1]), flush=True)

    def rates(mode: str) -> list[float]:
        return [r["images_per_second"] for r in rounds if r["mode"] == mode]

    ratio = statistics.median(rates("compiled")) / statistics.median(rates("eager"))
    recipe = args.recipe.resolve()
    result = {
        "recipe": str(recipe.relative_to(ROOT)) if recipe.is_relative_to(ROOT) else str(recipe),
        "model": config.model,
        "width": config.width,
        "batch_size": config.batch_size,
        "precision": str(precision.compute_dtype(config.precision, torch.device("cpu"))),
        "optimizer": config.optimizer.name,
        "steps": args.steps,
        "rounds": rounds,
        "compiled_over_eager": round(ratio, 3),
        "machine": machine,
        "load_average_at_end": os.getloadavg(),
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stem = args.results_dir / f"trainer-compile-{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# torch.compile against eager: {result['recipe']}",
        "",
        f"{config.model} width {config.width}, batch {config.batch_size}, {result['precision']}, "
        f"{config.optimizer.name}, channels_last, synthetic batches; {args.steps} steps timed per round "
        f"after {FIRST_STEPS} start-up and {WARMUP_STEPS} warm-up steps. Machine: {machine['cpu_model']} "
        f"({machine['cpu_family_model']}), {machine['nproc']} cores, "
        f"bf16 units {machine['torch_bf16_units']}, torch {machine['torch']}, "
        f"load average at start {machine['load_average_at_start'][0]:.2f}.",
        "",
        "| round | mode | first steps (s) | img/s |",
        "| --- | --- | --- | --- |",
        *(
            f"| {r['round']} | {r['mode']} | {r['first_steps_seconds']} | {r['images_per_second']} |"
            for r in rounds
        ),
        "",
        f"Compiled over eager, median img/s: **{ratio:.3f}**.",
        "",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines))
    print(f"compiled over eager: {ratio:.3f}; results in {stem}.{{json,md}}")


if __name__ == "__main__":
    main()
