"""The budget recipe with whitened_cnn's three conv groups at other widths than (w, 2w, 4w) (issue 26).

`TrainerConfig.width` only scales all three groups together; the CIFAR-10 speed runs widen the later,
low-resolution groups more than the first (airbench: 64, 256, 256), where a channel costs a quarter or a
sixteenth as much. This runs `trainer_speed.py` unchanged, in this process, with `WhitenedCNN` built from
`--widths` instead, so a candidate profile is measured the way the recipe is before the config grows a
field for it. Everything after `--widths` goes to trainer_speed.py:

    python benchmarks/trainer_stage_widths.py --widths 32,64,256 --parts recipe --recipes budget \
        --split tune --precision bf16 --seed-from benchmarks/results/trainer-speed-recipe-seed-report.json \
        --results-dir /tmp/widths-32-64-256

A saved model of such a run loads only in a process that builds the same widths (this one does, for the
held-out scoring): the model file records `width`, not the profile.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from kubetrain_trainer import models
from torch import nn

SPEED_BENCHMARK = Path(__file__).with_name("trainer_speed.py")


def build_with_widths(widths: list[int]) -> None:
    """Make every WhitenedCNN built from now on in this process use `widths` for its conv groups."""

    def init(self: models.WhitenedCNN, num_classes: int = 10, width: int = 32) -> None:
        nn.Module.__init__(self)
        self.whiten = models.PatchWhitening()
        channels = self.whiten.out_channels
        groups = []
        for out in widths:
            groups.append(models._ConvGroup(channels, out))
            channels = out
        self.groups = nn.Sequential(*groups)
        self.head = nn.Linear(channels, num_classes, bias=False)
        self.logit_scale = 1.0 / 9.0

    models.WhitenedCNN.__init__ = init  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--widths", required=True, help="three comma-separated channel counts, e.g. 32,64,256"
    )
    parser.add_argument("--machine-note", default="", help="what else ran on the machine meanwhile")
    args, rest = parser.parse_known_args()
    widths = [int(w) for w in args.widths.split(",")]
    if len(widths) != 3 or min(widths) < 8:
        parser.error("--widths takes three channel counts of at least 8")
    build_with_widths(widths)
    note = "; ".join(filter(None, [f"whitened_cnn groups {args.widths}", args.machine_note]))
    sys.argv = [str(SPEED_BENCHMARK), *rest, "--machine-note", note]
    runpy.run_path(str(SPEED_BENCHMARK), run_name="__main__")


if __name__ == "__main__":
    main()
