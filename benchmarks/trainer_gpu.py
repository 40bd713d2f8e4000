"""The trainer on a GPU (a lent H200; CI has none): does its CUDA path work, and does its data path keep
the GPU busy?

1. `pytest tests/trainer/test_cuda.py`: training under bf16 autocast with on-device crops and flips, a
   mid-epoch resume, and a GPU-trained model predicting on a CPU.
2. Ceiling: whitened_cnn steps fed by kubetrain's BatchLoader (crops, flips, normalisation on the GPU)
   against steps on one resident batch, same model and batch, in paired rounds.
3. Training runs through the Trainer on real CIFAR-10 JPEGs (the split of trainer_speed.py: the last 500
   images of every class held out), decoding included: the CPU recipe of examples/cifar10-fast.yaml as
   it is but on the GPU, then wider and longer (what a GPU affords), with and without torch.compile.

    python benchmarks/trainer_gpu.py --results $OUT     # on the GPU machine
    python benchmarks/trainer_gpu.py --device cpu --per-class 60 --epochs-scale 0.2 --results /tmp/x

The second line dry-runs every part on a CPU with a small data set (the test file skips there).
Results go to RESULTS/trainer-gpu.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from kubetrain_trainer import batches, datasets, models, precision
from kubetrain_trainer.distributed import WorldEnv
from kubetrain_trainer.preprocessing import fit_preprocessing
from kubetrain_trainer.trainer import build_trainer
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_speed import RESULTS, machine_info, prepare_data, recipe_config

REPO = Path(__file__).resolve().parent.parent
_SOURCES = [str(REPO / part) for part in ("operator", "trainer", "tests")]

RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "cpu_recipe": ("examples/cifar10-fast.yaml's trainer as it is (width 32, batch 256, 7 epochs)", {}),
    "wide": (
        "width 64, batch 512 at lr 0.4, 12 epochs",
        {"width": 64, "batch_size": 512, "epochs": 12, "optimizer": {"lr": 0.4}},
    ),
    "wide_compiled": (
        "the same with compile: true",
        {"width": 64, "batch_size": 512, "epochs": 12, "optimizer": {"lr": 0.4}, "compile": True},
    ),
}


def gpu_info() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"gpu": None}
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
    }


def run_tests(device: str) -> dict[str, Any]:
    """The CUDA test file, in a subprocess; its verdict and the last lines it printed."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/trainer/test_cuda.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([*_SOURCES, os.environ.get("PYTHONPATH", "")])},
    )
    print(result.stdout[-3000:], result.stderr[-2000:], flush=True)
    return {
        "device": device,
        "returncode": result.returncode,
        "seconds": round(time.perf_counter() - started, 1),
        "tail": result.stdout.strip().splitlines()[-6:],
    }


def run_training(root: Path, out: Path, label: str, overrides: dict[str, Any], device: str) -> dict[str, Any]:
    """One Trainer run from scratch: set-up (decoding) seconds, per-epoch accuracy, images/s."""
    config = recipe_config(root, out, {**overrides, "device": device})
    shutil.rmtree(out / label, ignore_errors=True)
    started = time.perf_counter()
    trainer = build_trainer(config, WorldEnv(), label)
    setup = time.perf_counter() - started
    history = trainer.train().history
    train_seconds = sum(epoch["train_seconds"] for epoch in history)
    return {
        "config": config.model_dump(
            mode="json", include={"model", "width", "epochs", "batch_size", "compile"}
        ),
        "setup_seconds": round(setup, 1),
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "first_epoch_train_seconds": round(history[0]["train_seconds"], 1),
        "images_per_second_after_first_epoch": round(
            statistics.median(epoch["images_per_second"] for epoch in history[1:]) if len(history) > 1 else 0,
            1,
        ),
        "val_accuracy": round(history[-1]["val_accuracy"], 4),
        "curve": [round(epoch["val_accuracy"], 4) for epoch in history],
    }


def run_ceiling(root: Path, device: torch.device, *, width: int, batch: int, steps: int) -> dict[str, Any]:
    """whitened_cnn under bf16 autocast: BatchLoader-fed steps against steps on one resident batch."""
    full = datasets.load_image_folder(root, 32, cache=True)
    train, _ = datasets.split_validation(full, 0.1)
    prep = fit_preprocessing(train.images, 32)

    def timed(feed: Any) -> float:
        torch.manual_seed(0)
        model = models.WhitenedCNN(10, width)
        model.fit_whitening(prep.normalize(train.images[:2000]).float())
        model = model.to(device).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
        started = 0.0
        for i, (images, labels) in enumerate(feed()):
            if i == 10:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
            with precision.autocast(device, precision.compute_dtype("auto", device)):
                loss = nn.functional.cross_entropy(model(images).float(), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if i == 10 + steps:
                break
        if device.type == "cuda":
            torch.cuda.synchronize()
        return batch * steps / (time.perf_counter() - started)

    loader = batches.BatchLoader(
        train,
        prep,
        batch_size=batch,
        rank=0,
        world_size=1,
        seed=0,
        augment=True,
        device=device,
        crop_padding=2,
    )
    resident = next(iter(loader))

    def compute_only() -> Any:
        while True:
            yield resident

    def kubetrain_loader() -> Any:
        epoch = 0
        while True:
            loader.set_epoch(epoch)
            yield from loader
            epoch += 1

    ceiling, ours = [], []
    for _ in range(3):
        ceiling.append(timed(compute_only))
        ours.append(timed(kubetrain_loader))
    return {
        "width": width,
        "batch_size": batch,
        "steps": steps,
        "ceiling_images_per_second": round(statistics.median(ceiling), 1),
        "kubetrain_images_per_second": round(statistics.median(ours), 1),
        "fraction_of_ceiling": round(statistics.median(o / c for o, c in zip(ours, ceiling, strict=True)), 3),
    }


def write_results(results: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "trainer-gpu.json").write_text(json.dumps(results, indent=2) + "\n")
    machine = results["machine"]
    lines = [
        "# trainer-gpu",
        "",
        f"Command: `{results['command']}`  ",
        f"Machine: {machine.get('gpu')} ({machine.get('gpu_memory_gib')} GiB, CUDA {machine.get('cuda')}), "
        f"{machine['nproc']} cores, {machine['cpu_model']}, torch {machine['torch']}  ",
        f"Data: {results.get('data')}",
        "",
    ]
    if "tests" in results:
        tests = results["tests"]
        lines += [
            f"tests/trainer/test_cuda.py: exit {tests['returncode']} in {tests['seconds']} s: "
            f"`{tests['tail'][-1] if tests['tail'] else ''}`",
            "",
        ]
    if results.get("runs"):
        lines += [
            "| run | what | set-up s | first epoch s | img/s after | train s | val acc |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, run in results["runs"].items():
            lines.append(
                f"| {name} | {RUNS[name][0]} | {run['setup_seconds']} | {run['first_epoch_train_seconds']} "
                f"| {run['images_per_second_after_first_epoch']} | {run['train_seconds']} "
                f"| {run['val_accuracy']} |"
            )
        lines.append("")
    if "ceiling" in results:
        c = results["ceiling"]
        lines.append(
            f"Ceiling (whitened_cnn width {c['width']}, batch {c['batch_size']}, bf16 autocast, {c['steps']} "
            f"steps): resident batch {c['ceiling_images_per_second']} img/s, BatchLoader-fed "
            f"{c['kubetrain_images_per_second']} img/s, ratio {c['fraction_of_ceiling']}."
        )
    (directory / "trainer-gpu.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--source", type=Path, default=REPO.parent / "shared" / "datasets" / "cifar10-train.tar.gz"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/kubetrain-gpu"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--per-class", type=int, default=None, help="training images per class (default all)")
    parser.add_argument("--epochs-scale", type=float, default=1.0, help="multiply every run's epochs")
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--ceiling-steps", type=int, default=50)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "machine": {**machine_info(), **gpu_info()},
        "runs": {},
    }
    results["tests"] = run_tests(args.device)
    write_results(results, args.results)
    root = prepare_data(args.source.resolve(), args.work, args.per_class)
    results["data"] = f"{sum(1 for _ in root.rglob('*.jpg'))} JPEGs under {root}"
    results["ceiling"] = run_ceiling(
        root, torch.device(args.device), width=64, batch=512, steps=args.ceiling_steps
    )
    write_results(results, args.results)
    out = args.work / "output"
    for name in filter(None, args.runs.split(",")):
        overrides = dict(RUNS[name][1])
        epochs = overrides.get("epochs", 7)
        overrides["epochs"] = max(1, round(epochs * args.epochs_scale))
        results["runs"][name] = run_training(root, out, name, overrides, args.device)
        print(name, results["runs"][name], flush=True)
        write_results(results, args.results)  # a stopped run keeps what it measured
    print((args.results / "trainer-gpu.md").read_text())


if __name__ == "__main__":
    main()
