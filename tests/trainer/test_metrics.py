"""Per-class precision / recall / F1 match hand-computed values."""

from __future__ import annotations

import pytest
import torch
from kubetrain_trainer.metrics import ClassReport

pytestmark = pytest.mark.unit


def test_precision_recall_f1_from_a_known_confusion_matrix() -> None:
    # rows: true class, columns: predicted. cat: 3 right, 1 called dog; dog: 2 right; bird: never predicted.
    matrix = torch.tensor([[3, 1, 0], [0, 2, 0], [1, 1, 0]])
    report = ClassReport(["cat", "dog", "bird"], matrix)
    rows = {r["class"]: r for r in report.rows()}
    assert rows["cat"]["precision"] == pytest.approx(0.75)
    assert rows["cat"]["recall"] == pytest.approx(0.75)
    assert rows["dog"]["precision"] == pytest.approx(0.5)
    assert rows["dog"]["recall"] == pytest.approx(1.0)
    assert rows["dog"]["f1"] == pytest.approx(round(2 * 0.5 / 1.5, 4))
    assert rows["bird"] == {"class": "bird", "precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}
    assert report.accuracy == pytest.approx(5 / 8)
    table = report.table()
    assert "macro avg" in table and "accuracy 0.6250" in table
    assert report.to_dict()["confusion_matrix"] == matrix.tolist()
