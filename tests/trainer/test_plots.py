"""The loss curve says what its lines are (issue 26 defect 8): a run with label smoothing trains on a
smoothed loss, which sits above the plain cross-entropy validation is measured in, so its legend says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubetrain_trainer import plots

pytestmark = pytest.mark.unit

HISTORY = [
    {"epoch": 1, "train_loss": 1.9, "val_loss": 1.6, "train_accuracy": 0.3, "val_accuracy": 0.4},
    {"epoch": 2, "train_loss": 1.5, "val_loss": 1.2, "train_accuracy": 0.5, "val_accuracy": 0.6},
]


def _legend(figure: object, axes: int) -> list[str]:
    return [text.get_text() for text in figure.axes[axes].get_legend().get_texts()]  # type: ignore[attr-defined]


def test_a_label_smoothed_training_loss_is_labelled_so_beside_the_plain_validation_loss() -> None:
    figure = plots.loss_curve_figure(HISTORY, label_smoothing=0.2)
    assert _legend(figure, 0) == ["train (label smoothing 0.2)", "validation"]
    assert _legend(figure, 1) == ["train", "validation"]  # accuracy is not smoothed


def test_without_label_smoothing_the_lines_are_train_and_validation(tmp_path: Path) -> None:
    assert _legend(plots.loss_curve_figure(HISTORY), 0) == ["train", "validation"]
    plots.loss_curve(tmp_path / "loss_curve.png", HISTORY, label_smoothing=0.1)
    assert (tmp_path / "loss_curve.png").read_bytes().startswith(b"\x89PNG")
