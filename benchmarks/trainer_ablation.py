"""What each piece of a fast CPU recipe buys (issue 13): the recipe of examples/cifar10-fast.yaml (or, with
`--recipe sprint`, of examples/cifar10-sprint.yaml) trained for a fixed number of epochs, then again with one
piece at a time turned back to the plain choice (for the sprint: to the fast recipe's choice).

Every run has the same data (real CIFAR-10 JPEGs, 4,000 images of every class for training and one of
trainer_speed.py's held-out splits of 500 scored, by default `tune`: ablations are tuning), epochs, width,
precision and seed; decoded images are cached before the first run, so the times
are training only and every run pays the same. The recipe runs first and last: the difference between its
two runs is the machine's noise (time) and the figure to read the others against.

    python benchmarks/trainer_ablation.py --epochs 2 --width 16
    python benchmarks/trainer_ablation.py --recipe sprint --epochs 1.5
    python benchmarks/trainer_ablation.py --epochs 8.4 --precision fp32 --suffix budget-fp32

Results go to benchmarks/results/trainer-recipe-ablation[-sprint].{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, get_args

import torch
import yaml
from kubetrain_trainer import datasets
from kubetrain_trainer.config import Precision
from kubetrain_trainer.config_loading import deep_merge
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.trainer import build_trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_speed import (
    RECIPE_FILE,
    RESULTS,
    SPLITS,
    SPRINT_FILE,
    machine_info,
    prepare_data,
    recipe_config,
)

FAST_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "recipe": ("the recipe as in examples/cifar10-fast.yaml", {}),
    "resnet_small": ("model resnet_small instead of whitened_cnn", {"model": "resnet_small"}),
    "no_lookahead": ("no lookahead averaging of the weights", {"optimizer": {"lookahead": False}}),
    "muon": (
        "muon on the convolution filters at filter_lr 0.1 instead of SGD",
        {"optimizer": {"name": "muon", "filter_lr": 0.1}},
    ),
    "muon_filter_lr_0.05": (
        "muon on the convolution filters at filter_lr 0.05 (0.1 was tuned at 4 epochs)",
        {"optimizer": {"name": "muon", "filter_lr": 0.05}},
    ),
    "seed_1": ("seed 1 instead of 0: how far another seed moves the same recipe", {"seed": 1}),
    "seed_2": ("seed 2 instead of 0", {"seed": 2}),
    "no_identity_init": (
        "convolutions at torch's random initialisation instead of identity_init",
        {"identity_init": False},
    ),
    "no_identity_init_seed_1": ("no identity_init, seed 1", {"identity_init": False, "seed": 1}),
    "no_identity_init_seed_2": ("no identity_init, seed 2", {"identity_init": False, "seed": 2}),
    "random_flip": ("flips drawn at random instead of alternating", {"flip": "random"}),
    "padding_4": ("crops shifted up to 4 pixels instead of 2", {"crop_padding": 4}),
    "no_augment": ("no crops or flips", {"augment": False}),
    "no_label_smoothing": ("label smoothing 0 instead of 0.2", {"optimizer": {"label_smoothing": 0.0}}),
    "plain_sgd": (
        "neither lookahead nor label smoothing (each cost about half a point at 8.4 epochs in fp32)",
        {"optimizer": {"lookahead": False, "label_smoothing": 0.0}},
    ),
    "batch_512": ("batch 512 at lr 0.4 instead of 256 at 0.3", {"batch_size": 512, "optimizer": {"lr": 0.4}}),
    "no_translate_tta": ("validation without the shifted views", {"eval_translate_tta": False}),
    "no_tta": (
        "validation without any test-time views",
        {"eval_translate_tta": False, "eval_flip_tta": False},
    ),
    "fp32": ("precision fp32 instead of bf16 autocast", {"precision": "fp32"}),
}

SPRINT_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "recipe": ("the recipe as in examples/cifar10-sprint.yaml", {}),
    "augment": ("crops shifted up to 2 pixels and alternating flips, as the fast recipe", {"augment": True}),
    "lookahead": (
        "lookahead averaging of the weights, as the fast recipe",
        {"optimizer": {"lookahead": True}},
    ),
    "batch_256": ("batch 256 at lr 0.3 instead of 128 at 0.2", {"batch_size": 256, "optimizer": {"lr": 0.3}}),
    "width_24": ("width 24 instead of 16", {"width": 24}),
    "identity_init": (
        "convolutions started as the identity on their input channels (identity_init)",
        {"identity_init": True},
    ),
    "no_tta": (
        "validation without any test-time views",
        {"eval_translate_tta": False, "eval_flip_tta": False},
    ),
    "fp32": ("precision fp32 instead of bf16 autocast", {"precision": "fp32"}),
}

RECIPES = {"fast": (RECIPE_FILE, FAST_VARIANTS), "sprint": (SPRINT_FILE, SPRINT_VARIANTS)}


def run_variant(
    root: Path, out: Path, label: str, overrides: dict[str, Any], recipe: Path = RECIPE_FILE
) -> dict[str, Any]:
    """Train one variant from scratch; its accuracy after each epoch and its training seconds."""
    config = recipe_config(root, out, deep_merge(overrides, {"data": {"cache_decoded": True}}), recipe)
    shutil.rmtree(out / label, ignore_errors=True)  # a previous run's checkpoints would make this one resume
    started = time.perf_counter()
    history = build_trainer(config, WorldEnv(), label).train().history
    return {
        "val_accuracy": round(history[-1]["val_accuracy"], 4),
        "train_seconds": round(sum(epoch["train_seconds"] for epoch in history), 1),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "curve": [round(epoch["val_accuracy"], 4) for epoch in history],
    }


def write_results(results: dict[str, Any], name: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    runs = results["runs"]
    recipe = [run["val_accuracy"] for run in runs if run["variant"] == "recipe"]
    reference = sum(recipe) / len(recipe)
    machine = results["machine"]
    lines = [
        f"# {name}",
        "",
        f"Command: `{results['command']}`  ",
        f"Machine: {machine['nproc']} cores, {machine['cpu_model']}, torch {machine['torch']}, load average "
        f"at start {'/'.join(f'{v:.1f}' for v in machine['load_average_at_start'])}, at end "
        f"{'/'.join(f'{v:.1f}' for v in machine['load_average_at_end'])} (this benchmark's own two threads "
        "count in it)  ",
        f"Each run: {results['epochs']} epochs at width {results['width']} in {results['precision']} from "
        f"`{results['recipe']}`, scored on the held-out split {results['split']}, seed and data identical, "
        "decoded "
        "images cached (training time only). The recipe ran first and last; deltas are against the mean of "
        f"its runs ({reference:.4f}).",
        "",
        "| run | what changed | val acc | delta | train s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        lines.append(
            f"| {run['variant']} | {run['description']} | {run['val_accuracy']:.4f} | "
            f"{run['val_accuracy'] - reference:+.4f} | {run['train_seconds']} |"
        )
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", type=Path, default=Path("../shared/datasets/cifar10-train.tar.gz"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/kubetrain-bench"))
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="fast")
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--width", type=int, help="override the recipe's width (the fast runs used 16)")
    parser.add_argument("--variants", help="comma-separated subset, in order (default: all of the recipe's)")
    parser.add_argument("--suffix", default="", help="appended to the results file name")
    parser.add_argument(
        "--split", choices=SPLITS, default="tune", help="held-out split scored (see trainer_speed)"
    )
    parser.add_argument("--precision", choices=get_args(Precision), help="every run in this precision")
    args = parser.parse_args()
    recipe, variants = RECIPES[args.recipe]
    chosen = [name for name in (args.variants or ",".join(variants)).split(",") if name]
    unknown = set(chosen) - set(variants)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {','.join(variants)}")
    order = ["recipe", *(name for name in chosen if name != "recipe"), "recipe"]
    torch.set_num_threads(2)
    recipe_trainer = yaml.safe_load(recipe.read_text())["spec"]["trainer"]
    root = prepare_data(args.source.resolve(), args.work, args.split, None)
    datasets.load_image_folder(root, 32, cache=True)  # decode once, outside every timed run
    results: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "machine": machine_info(),
        "recipe": str(recipe.relative_to(recipe.parent.parent)),
        "epochs": args.epochs,
        "split": args.split,
        "precision": args.precision or recipe_trainer["precision"],
        "width": args.width or recipe_trainer["width"],
        "runs": [],
    }
    name = "trainer-recipe-ablation" + ("" if args.recipe == "fast" else f"-{args.recipe}")
    name += f"-{args.suffix}" if args.suffix else ""
    out = args.work / "ablation-output"
    base = {
        "epochs": args.epochs,
        **({"width": args.width} if args.width else {}),
        **({"precision": args.precision} if args.precision else {}),
    }
    for number, variant in enumerate(order):
        description, overrides = variants[variant]
        run = run_variant(root, out, f"{variant}-{number}", deep_merge(base, overrides), recipe)
        results["runs"].append({"variant": variant, "description": description, **run})
        print(f"{variant}: {run}", flush=True)
        results["machine"]["load_average_at_end"] = os.getloadavg()
        write_results(results, name)  # a stopped run keeps what it measured
    print((RESULTS / f"{name}.md").read_text())


if __name__ == "__main__":
    main()
