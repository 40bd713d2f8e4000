"""The progress contract with the operator: `<output>/<job>/progress.json` plus the pod annotation.

Rank 0 writes the same JSON object to both after every epoch, and once at start-up when it resumed:
`{"epoch": int, "epochs": int, "step": int, "loss": float | null, "validationLoss": float | null,
"accuracy": float | null, "imagesPerSecond": float | null, "updatedAt": RFC 3339}`: `loss` is the epoch's
mean training loss, `validationLoss` and `accuracy` are measured on the validation split, and
`imagesPerSecond` is the epoch's training throughput of the whole group (global batch x steps / seconds).
A resumed run adds `"resumedFrom": {"attempt": int, "epoch": int, "step": int}`: the restart attempt
(KUBETRAIN_RESTART_ATTEMPT) and the checkpoint's position (the epoch of its last step, and the run's step
count), so comparing it with the last progress of the attempt before shows how much training the restart
lost.
The annotation is a JSON merge patch of its own pod through the in-cluster service account, with urllib
and ssl only (the trainer image carries no Kubernetes client); a failed patch is a warning, never fatal.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubetrain_trainer import atomic, contract

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_ACCOUNT_DIR_ENV = "KUBETRAIN_SERVICE_ACCOUNT_DIR"
"""Overrides SERVICE_ACCOUNT_DIR: for processes that play a pod outside one (the test suite's kubelet)."""
_PATCH_TIMEOUT_SECONDS = 5.0


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def progress_record(
    epoch: int,
    epochs: int,
    step: int,
    loss: float | None,
    accuracy: float | None,
    *,
    validation_loss: float | None = None,
    images_per_second: float | None = None,
    resumed_from: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The progress JSON object (`loss` training, `validation_loss` and `accuracy` validation,
    `images_per_second` the epoch's training throughput), with the time it was produced."""
    record: dict[str, Any] = {
        "epoch": epoch,
        "epochs": epochs,
        "step": step,
        "loss": _rounded(loss),
        "validationLoss": _rounded(validation_loss),
        "accuracy": _rounded(accuracy),
        "imagesPerSecond": None if images_per_second is None else round(float(images_per_second), 1),
        "updatedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if resumed_from is not None:
        record["resumedFrom"] = dict(resumed_from)
    return record


@dataclass
class PodAnnotator:
    """Merge-patches annotations of one pod (the trainer's own) with the API server's REST interface: the
    progress report (`patch`) and the heartbeat (`heartbeat.Heartbeat`)."""

    api_url: str
    namespace: str
    pod: str
    token_path: Path
    ca_path: Path | None

    @classmethod
    def from_environment(cls) -> PodAnnotator | None:
        """An annotator when running in a pod with a service-account token, else None (local runs)."""
        pod = os.environ.get(contract.POD_NAME)
        namespace = os.environ.get(contract.POD_NAMESPACE)
        account_dir = Path(os.environ.get(SERVICE_ACCOUNT_DIR_ENV, SERVICE_ACCOUNT_DIR))
        token = account_dir / "token"
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        if not (pod and namespace and host and token.is_file()):
            return None
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", namespace, pod, token, account_dir / "ca.crt")

    def annotate(self, key: str, record: dict[str, Any]) -> None:
        """Set the pod's annotation `key` to `record` as JSON, leaving its other annotations as they are;
        raises OSError (urllib's URLError and HTTPError, ssl's SSLError) when the API refused or failed."""
        body = json.dumps({"metadata": {"annotations": {key: json.dumps(record)}}})
        request = urllib.request.Request(
            f"{self.api_url}/api/v1/namespaces/{self.namespace}/pods/{self.pod}",
            data=body.encode(),
            method="PATCH",
            headers={
                "Content-Type": "application/merge-patch+json",
                "Authorization": f"Bearer {self.token_path.read_text(encoding='utf-8').strip()}",
            },
        )
        context = None
        if self.api_url.startswith("https://"):
            context = ssl.create_default_context(cafile=str(self.ca_path) if self.ca_path else None)
        with urllib.request.urlopen(request, timeout=_PATCH_TIMEOUT_SECONDS, context=context) as response:
            response.read()

    def patch(self, record: dict[str, Any]) -> bool:
        """Set the progress annotation to `record`; returns False (after a warning) when the API refused or
        failed."""
        try:
            self.annotate(contract.PROGRESS_ANNOTATION, record)
            return True
        except OSError as error:
            log.warning("could not patch pod %s/%s progress annotation: %s", self.namespace, self.pod, error)
            return False


class ProgressReporter:
    """Publishes progress records to the job's progress file and, in a pod, to the pod annotation."""

    def __init__(self, job_dir: Path, annotator: PodAnnotator | None) -> None:
        self.path = job_dir / contract.PROGRESS_FILE
        self.annotator = annotator

    def report(self, record: dict[str, Any]) -> None:
        """Write the file atomically (the operator may read it mid-write) and patch the annotation."""
        atomic.write_text_atomic(self.path, json.dumps(record) + "\n")
        if self.annotator is not None:
            self.annotator.patch(record)
