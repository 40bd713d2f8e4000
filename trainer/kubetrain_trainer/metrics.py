"""Classification metrics from a confusion matrix, and the per-class table printed in the log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ClassReport:
    """Per-class precision / recall / F1 and overall accuracy derived from one confusion matrix."""

    classes: list[str]
    matrix: torch.Tensor

    @property
    def accuracy(self) -> float:
        """Share of correct predictions (0 for an empty matrix)."""
        total = int(self.matrix.sum())
        return float(self.matrix.diag().sum()) / total if total else 0.0

    def rows(self) -> list[dict[str, Any]]:
        """One dict per class; undefined ratios (no predictions or no samples) are 0, as in sklearn."""
        matrix = self.matrix.double()
        true_pos = matrix.diag()
        predicted = matrix.sum(dim=0)
        support = matrix.sum(dim=1)
        precision = torch.where(predicted > 0, true_pos / predicted.clamp_min(1), torch.zeros_like(true_pos))
        recall = torch.where(support > 0, true_pos / support.clamp_min(1), torch.zeros_like(true_pos))
        denom = precision + recall
        f1 = torch.where(denom > 0, 2 * precision * recall / denom.clamp_min(1e-12), torch.zeros_like(denom))
        return [
            {
                "class": name,
                "precision": round(float(precision[i]), 4),
                "recall": round(float(recall[i]), 4),
                "f1": round(float(f1[i]), 4),
                "support": int(support[i]),
            }
            for i, name in enumerate(self.classes)
        ]

    def table(self) -> str:
        """Fixed-width per-class table with a macro average, for pod logs and the evaluate command."""
        rows = self.rows()
        width = max([len("class"), *(len(r["class"]) for r in rows)])
        lines = [f"{'class':<{width}}  precision  recall     f1  support"]
        for r in rows:
            lines.append(
                f"{r['class']:<{width}}  {r['precision']:9.4f}  {r['recall']:6.4f}  {r['f1']:6.4f}  "
                f"{r['support']:7d}"
            )
        if rows:
            macro = {k: sum(r[k] for r in rows) / len(rows) for k in ("precision", "recall", "f1")}
            total = sum(r["support"] for r in rows)
            lines.append(
                f"{'macro avg':<{width}}  {macro['precision']:9.4f}  {macro['recall']:6.4f}  "
                f"{macro['f1']:6.4f}  {total:7d}"
            )
        lines.append(f"accuracy {self.accuracy:.4f}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for metrics.json; `accuracy` is null when nothing was evaluated (no validation
        split), since 0 would claim a measured model that gets every image wrong."""
        return {
            "accuracy": round(self.accuracy, 6) if int(self.matrix.sum()) else None,
            "classes": self.classes,
            "per_class": self.rows(),
            "confusion_matrix": self.matrix.tolist(),
        }
