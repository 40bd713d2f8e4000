"""PNG figures for the job's output directory, drawn with matplotlib's headless Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kubetrain_trainer import atomic


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    atomic.write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    _figure().close(fig)


def loss_curve(path: Path, history: list[dict[str, Any]], label_smoothing: float = 0.0) -> None:
    """`loss_curve_figure` as a PNG at `path`."""
    _save(loss_curve_figure(history, label_smoothing), path)


def loss_curve_figure(history: list[dict[str, Any]], label_smoothing: float = 0.0) -> Any:
    """Train and validation loss (left) and accuracy (right) per epoch; a run without a validation split
    (its validation figures null) shows the training curves alone.

    The training loss is the one optimised: with `label_smoothing` it is measured against smoothed targets
    and sits above the plain cross-entropy of validation even where the model fits both alike, so its
    legend names the smoothing."""
    plt = _figure()
    epochs = [h["epoch"] for h in history]
    validated = any(h.get("val_loss") is not None for h in history)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    train_label = f"train (label smoothing {label_smoothing:g})" if label_smoothing else "train"
    left.plot(epochs, [h["train_loss"] for h in history], marker="o", label=train_label)
    if validated:
        left.plot(epochs, [h["val_loss"] for h in history], marker="o", label="validation")
    left.set(xlabel="epoch", ylabel="loss", title="Loss")
    left.legend()
    right.plot(epochs, [h["train_accuracy"] for h in history], marker="o", label="train")
    if validated:
        right.plot(epochs, [h["val_accuracy"] for h in history], marker="o", label="validation")
    right.set(xlabel="epoch", ylabel="accuracy", title="Accuracy", ylim=(0, 1))
    right.legend()
    return fig


def confusion_matrix(path: Path, matrix: torch.Tensor, classes: list[str]) -> None:
    """Heat map of the validation confusion matrix with counts in the cells."""
    plt = _figure()
    size = max(4.0, 0.6 * len(classes) + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(matrix.numpy(), cmap="Blues")
    ax.set(xticks=range(len(classes)), yticks=range(len(classes)), xlabel="predicted", ylabel="true")
    ax.set_xticklabels(classes, rotation=45, ha="right")
    ax.set_yticklabels(classes)
    peak = int(matrix.max()) if matrix.numel() else 0
    if len(classes) <= 20:
        for i in range(len(classes)):
            for j in range(len(classes)):
                value = int(matrix[i, j])
                ax.text(j, i, value, ha="center", va="center", color="white" if value > peak / 2 else "black")
    ax.set_title("Validation confusion matrix")
    _save(fig, path)


def prediction_grid(
    path: Path, images: torch.Tensor, labels: torch.Tensor, predictions: torch.Tensor, classes: list[str]
) -> None:
    """Up to 16 uint8 images with predicted / true labels; wrong predictions titled in red."""
    plt = _figure()
    count = min(16, len(images))
    cols = 4
    rows = max(1, (count + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols, 2.4 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= count:
            continue
        ax.imshow(images[i].permute(1, 2, 0).numpy())
        correct = int(predictions[i]) == int(labels[i])
        ax.set_title(
            f"{classes[int(predictions[i])]}\n(true {classes[int(labels[i])]})",
            fontsize=8,
            color="black" if correct else "red",
        )
    _save(fig, path)
