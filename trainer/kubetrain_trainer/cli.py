"""`kubetrain train | evaluate | predict`: argument parsing and process management only.

torch is imported inside the command functions, never at module level, so `kubetrain --help` stays
fast and the operator image (which has no torch) can import this module. `main` returns the exit code
documented in `exit_codes`; it never raises.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from kubetrain_trainer import config_loading, contract, distributed, logging_setup, memory, termination
from kubetrain_trainer.config import TEST_TIME_VIEWS
from kubetrain_trainer.exit_codes import PERMANENT_EXIT_CODES, ExitCode
from kubetrain_trainer.failures import ConfigError, PeerLostError, TrainerError, classify

log = logging.getLogger("kubetrain_trainer")

DEFAULT_JOB_NAME = "local"


def _add_train_parser(commands: Any) -> None:
    train = commands.add_parser(
        "train",
        help="train a model (config from --config and/or $KUBETRAIN_TRAINER_CONFIG, flags override both)",
        description="Train with DDP when WORLD_SIZE > 1. Exit codes: 0 ok, 2 bad config, 3 data error "
        "(permanent); 1 unexpected, 10 rendezvous timeout, 11 peer lost, 12 out of memory, 130 interrupted.",
    )
    train.add_argument("--config", type=Path, help="YAML or JSON file holding a TrainerConfig")
    train.add_argument("--epochs", type=float, help="override epochs (a fraction ends the last early)")
    train.add_argument("--batch-size", type=int, help="override batch_size (per process)")
    train.add_argument("--lr", type=float, help="override optimizer.lr")
    train.add_argument("--model", help="override model")
    train.add_argument("--seed", type=int, help="override seed")
    train.add_argument("--device", help="override device (auto, cpu, cuda)")
    train.add_argument("--output-dir", help="override output_dir")
    train.add_argument("--data-root", help="override data.root")
    train.add_argument("--dataset", help="override data.dataset (cifar10, imagefolder, fake)")
    train.add_argument(
        "--verbose", action="store_true", help="log INFO lines from every rank, not just rank 0"
    )


def _add_views_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--tta",
        nargs="?",
        const="flip",
        default="run",
        choices=TEST_TIME_VIEWS,
        help="test-time views averaged per image: run (default) those the model's training run validated "
        "with, so evaluate reproduces metrics.json; none; flip (the image and its mirror, also a bare "
        "--tta); translate (shifted one pixel each way); flip+translate (6 views)",
    )


def _add_evaluate_parser(commands: Any) -> None:
    evaluate = commands.add_parser(
        "evaluate", help="accuracy and per-class table of a model on a dataset split"
    )
    evaluate.add_argument("model", type=Path, help="model.pt written by `kubetrain train`")
    evaluate.add_argument("--data-root", help="dataset root (default: the one the model was trained on)")
    evaluate.add_argument("--dataset", help="cifar10, imagefolder or fake (default: the training one)")
    evaluate.add_argument("--split", choices=["validation", "train", "all"], default="validation")
    evaluate.add_argument("--batch-size", type=int, default=512)
    evaluate.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    _add_views_argument(evaluate)
    evaluate.add_argument("--json", action="store_true", help="print a JSON report instead of the table")


def _add_predict_parser(commands: Any) -> None:
    predict = commands.add_parser("predict", help="classify image files or directories with a trained model")
    predict.add_argument("model", type=Path, help="model.pt written by `kubetrain train`")
    predict.add_argument("images", type=Path, nargs="+", help="image files and/or directories (recursed)")
    predict.add_argument("--batch-size", type=int, default=256)
    predict.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    _add_views_argument(predict)
    predict.add_argument(
        "--json", action="store_true", help="print a JSON list instead of one line per image"
    )


def build_parser() -> argparse.ArgumentParser:
    """The parser for the trainer's three subcommands (argv starts with the subcommand)."""
    parser = argparse.ArgumentParser(prog="kubetrain", description="kubetrain's built-in trainer")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(commands)
    _add_evaluate_parser(commands)
    _add_predict_parser(commands)
    return parser


def train_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Flags that were given, as a nested TrainerConfig fragment."""
    overrides: dict[str, Any] = {}
    flat = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "model": args.model,
        "seed": args.seed,
        "device": args.device,
        "output_dir": args.output_dir,
    }
    overrides.update({k: v for k, v in flat.items() if v is not None})
    data = {k: v for k, v in {"root": args.data_root, "dataset": args.dataset}.items() if v is not None}
    if data:
        overrides["data"] = data
    if args.lr is not None:
        overrides["optimizer"] = {"lr": args.lr}
    return overrides


TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
"""Set by torchrun's agent in its workers' environment: how often it restarts them after a failure."""


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"received signal {signal.Signals(signum).name}")


def _record_exit(code: ExitCode, text: str) -> None:
    """Record a failure's code where the kubelet reads it, so torchrun's exit 1 cannot hide it."""
    record_path = os.environ.get(contract.TERMINATION_LOG)
    if record_path:
        termination.write_record(Path(record_path), termination.ExitRecord(int(code), code.name, text))


def _stop_a_restarting_agent(code: ExitCode) -> None:
    """Keep a permanent failure from being retried inside the pod.

    An elastic worker's torchrun restarts its processes up to `--max-restarts` times (the survivors of a
    lost peer re-rendezvous that way), so a bad config or missing data would fail that many times before
    the operator saw it. The trainer stops its agent instead: torchrun exits on SIGTERM without closing the
    rendezvous (the other workers' agents carry on), the container fails, and the operator reads the
    recorded code and fails the job at once. Fixed-size workers run torchrun without restarts: nothing
    to stop."""
    if code not in PERMANENT_EXIT_CODES:
        return
    if int(os.environ.get(TORCHELASTIC_MAX_RESTARTS) or 0) <= 0:
        return
    log.error("exit code %d cannot be cured by a restart: stopping torchrun (pid %d)", code, os.getppid())
    # torchrun passes the SIGTERM on to this process: it is on its way out with its code recorded, and
    # an interrupt raised here now would replace that exit with "interrupted".
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.kill(os.getppid(), signal.SIGTERM)


def _record_failure(error: BaseException) -> tuple[ExitCode, BaseException]:
    """The failure's code and the error it stands for, recorded for the kubelet (the first record in the
    container stays: `termination`)."""
    failure = distributed.peer_failure()
    if failure is not None and classify(error) in {ExitCode.UNEXPECTED_ERROR, ExitCode.PEER_LOST}:
        # What the aborted group raised here only echoes the other rank's failure: name that one.
        error = PeerLostError(f"{failure} (this rank left the group: {type(error).__name__}: {error})")
    code = classify(error)
    _record_exit(code, str(error) or type(error).__name__)
    return code, error


def _report_failure(error: BaseException) -> int:
    code, error = _record_failure(error)
    if isinstance(error, TrainerError):
        log.error("%s (exit code %d, %s)", error, code, code.name)
    elif code == ExitCode.INTERRUPTED:
        log.error("interrupted: %s (exit code %d)", error or "SIGINT", code)
    else:
        log.error(
            "%s\n%s: %s (exit code %d, %s)",
            traceback.format_exc().rstrip(),
            type(error).__name__,
            error,
            code,
            code.name,
        )
    _stop_a_restarting_agent(code)  # last: the error is recorded and logged before torchrun stops
    return int(code)


def run_train(args: argparse.Namespace) -> int:
    """Config and environment first (cheap, permanent failures), then the process group and training."""
    world = distributed.read_world_env()
    logging_setup.configure(world.rank, args.verbose)
    config = config_loading.load_config(args.config, train_overrides(args))
    signal.signal(signal.SIGTERM, _raise_interrupt)
    memory.return_freed_buffers()
    from kubetrain_trainer.components.placement import select_device
    from kubetrain_trainer.trainer import build_trainer

    backend = "nccl" if select_device(config, world).type == "cuda" else "gloo"
    try:
        distributed.init_process_group(
            world, backend, config.rendezvous_timeout_seconds, config.collective_timeout_seconds
        )
        job_name = os.environ.get(contract.JOB_NAME) or DEFAULT_JOB_NAME
        attempt = int(os.environ.get(contract.RESTART_ATTEMPT) or 0)
        trainer = build_trainer(config, world, job_name, os.environ.get(contract.JOB_UID, ""), attempt)
        result = trainer.train()
        accuracy = result.report.accuracy
        if len(trainer.data.validation):
            log.info("done: validation accuracy %.4f, artifacts in %s", accuracy, result.job_dir)
        else:
            log.info("done (no validation split), artifacts in %s", result.job_dir)
        return 0
    except BaseException as error:
        # Recorded first, then announced before leaving the group (the other ranks may be waiting for this
        # one in a collective): a rank told of it records PEER_LOST, and the container's record, which
        # the first process to fail writes, must be this root cause (say a data error, not retried).
        _record_failure(error)
        distributed.announce_failure(f"{type(error).__name__}: {error}")
        raise
    finally:
        distributed.destroy_process_group()


def _device(name: str) -> Any:
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda requested but no GPU is visible")
    use_cuda = name == "cuda" or (name == "auto" and torch.cuda.is_available())
    return torch.device("cuda" if use_cuda else "cpu")


def run_evaluate(args: argparse.Namespace) -> int:
    """Evaluate a model file on a split of a dataset and print accuracy with the per-class table."""
    from kubetrain_trainer import artifacts, datasets, evaluation
    from kubetrain_trainer.metrics import ClassReport

    logging_setup.configure()
    device = _device(args.device)
    trained = artifacts.load_model(args.model, device)
    data_config = trained.config.data.model_copy(
        update={k: v for k, v in {"root": args.data_root, "dataset": args.dataset}.items() if v is not None}
    )
    split = datasets.load(data_config, trained.config.seed)
    if split.classes != trained.classes:
        raise ConfigError(
            f"dataset classes {split.classes} differ from the model's classes {trained.classes}"
        )
    data = split.whole() if args.split == "all" else getattr(split, args.split)
    result = evaluation.evaluate_saved(trained, data, args.tta, device=device, batch_size=args.batch_size)
    report = ClassReport(trained.classes, result.matrix)
    if args.json:
        print(
            json.dumps({"split": args.split, "images": result.count, "loss": result.loss, **report.to_dict()})
        )
    else:
        print(f"{args.split} split of {data_config.root}: {result.count} images, loss {result.loss:.4f}")
        print(report.table())
    return 0


def run_predict(args: argparse.Namespace) -> int:
    """Print `path: label_id, label, score` per image (or a JSON list) using the model's preprocessing."""
    from kubetrain_trainer import artifacts, evaluation, inference

    logging_setup.configure()
    device = _device(args.device)
    trained = artifacts.load_model(args.model, device)
    paths = inference.expand_image_paths(args.images)
    flip_tta, translate_tta = evaluation.chosen_views(args.tta, trained.config)
    predictions = inference.predict_files(
        trained, paths, device, args.batch_size, flip_tta=flip_tta, translate_tta=translate_tta
    )
    if args.json:
        print(json.dumps([p.to_dict() for p in predictions], indent=2))
    else:
        for p in predictions:
            print(f"{p.path}: {p.label_id}, {p.label}, {p.score:.4f}")
    return 0


def main(argv: list[str]) -> int:
    """Entry point for `kubetrain train|evaluate|predict ...`; returns the process exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: 0 for --help, 2 for bad arguments (already printed)
        if exit_.code:
            _record_exit(ExitCode.BAD_CONFIG, f"invalid arguments: {' '.join(argv)}")
        return int(exit_.code or 0)
    command = {"train": run_train, "evaluate": run_evaluate, "predict": run_predict}[args.command]
    try:
        return command(args)
    except BaseException as error:
        if not logging.getLogger().handlers:
            logging_setup.configure()
        return _report_failure(error)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
