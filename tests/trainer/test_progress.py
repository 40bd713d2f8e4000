"""The progress contract: progress.json on disk and a merge patch of the pod's annotation."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pod_api
import pytest
from kubetrain_trainer import contract
from kubetrain_trainer.progress import PodAnnotator, ProgressReporter, progress_record

pytestmark = pytest.mark.unit


@pytest.fixture
def api() -> Iterator[pod_api.PodApi]:
    with pod_api.serving() as served:
        yield served


def test_report_writes_progress_json_and_merge_patches_the_pod_annotation(
    api: pod_api.PodApi, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    annotator = PodAnnotator(api.url, "team-a", "job-worker-0", token, None)
    record = progress_record(
        epoch=3, epochs=10, step=300, loss=0.5, accuracy=0.75, validation_loss=0.6, images_per_second=1234.56
    )
    ProgressReporter(tmp_path / "job", annotator).report(record)

    assert json.loads((tmp_path / "job" / "progress.json").read_text()) == record
    assert set(record) == {
        "epoch", "epochs", "step", "loss", "validationLoss", "accuracy", "imagesPerSecond", "updatedAt"
    }  # fmt: skip
    assert record["imagesPerSecond"] == 1234.6
    (request,) = api.requests
    assert request["path"] == "/api/v1/namespaces/team-a/pods/job-worker-0"
    assert request["headers"]["Content-Type"] == "application/merge-patch+json"
    assert request["headers"]["Authorization"] == "Bearer secret-token"
    annotation = request["body"]["metadata"]["annotations"][contract.PROGRESS_ANNOTATION]
    assert json.loads(annotation) == record


def test_a_refused_patch_is_a_warning_and_the_file_is_still_written(
    api: pod_api.PodApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api.status = 403
    token = tmp_path / "token"
    token.write_text("t")
    reporter = ProgressReporter(tmp_path, PodAnnotator(api.url, "ns", "pod", token, None))
    with caplog.at_level(logging.WARNING):
        reporter.report(progress_record(1, 2, 10, 1.0, None))
    assert "could not patch pod ns/pod" in caplog.text
    assert json.loads((tmp_path / "progress.json").read_text())["accuracy"] is None


def test_outside_a_pod_there_is_no_annotator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(contract.POD_NAME, raising=False)
    assert PodAnnotator.from_environment() is None


def test_a_resumed_run_reports_the_attempt_epoch_and_step_it_resumed_from(tmp_path: Path) -> None:
    resumed = progress_record(2, 10, 250, None, None, resumed_from={"attempt": 1, "epoch": 3, "step": 240})
    ProgressReporter(tmp_path, None).report(resumed)
    written = json.loads((tmp_path / "progress.json").read_text())
    assert written["resumedFrom"] == {"attempt": 1, "epoch": 3, "step": 240}
    assert written["loss"] is None  # nothing trained in this attempt yet
    assert "resumedFrom" not in progress_record(2, 10, 250, 0.5, None)
