"""The operator's pods really train: their rendered commands run as real DDP processes (see real_kubelet)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from testcluster.cluster import Cluster
from testcluster.operator_process import OperatorProcess
from testcluster.real_kubelet import REAL_ANNOTATION, RealKubelet

pytestmark = [pytest.mark.cluster, pytest.mark.distributed]

# Rank 0 patches its own pod's progress annotation with the pod's service account, as in a real cluster;
# that account needs exactly this: patch, nothing else (the Helm chart grants the same in worker namespaces).
PROGRESS_RBAC = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: kubetrain-worker-progress}
rules:
- {apiGroups: [""], resources: [pods], verbs: [patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: kubetrain-worker-progress}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: kubetrain-worker-progress}
subjects:
- {kind: ServiceAccount, name: default}
"""


@pytest.mark.trains
def test_trainingjob_status_comes_from_real_ddp_training(
    cluster: Cluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=PROGRESS_RBAC)
    manifest = {
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "real"},
        "spec": {
            "image": "registry.local/kubetrain-trainer:test",
            "workers": 2,
            "trainer": {
                "epochs": 2,
                "batch_size": 16,
                "device": "cpu",
                "data": {"dataset": "fake", "fake_size": 96, "root": "/data"},
                "output_dir": "/output",
            },
            "storage": [
                {"name": "data", "mountPath": "/data", "emptyDir": {}},
                {"name": "output", "mountPath": "/output", "emptyDir": {}},
            ],
            "podAnnotations": {REAL_ANNOTATION: "true"},
        },
    }
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(manifest))
    kubelet = RealKubelet(cluster, tmp_path)
    exit_codes = kubelet.run(namespace, "kubetrain.io/job-name=real", expected=2)
    assert sorted(exit_codes.values()) == [0, 0], {pod: kubelet.log(pod)[-2000:] for pod in exit_codes}

    cluster.kubectl("-n", namespace, "wait", "--for=condition=Succeeded", "tj/real", "--timeout=60s")
    status = json.loads(cluster.kubectl("-n", namespace, "get", "tj", "real", "-o", "json"))["status"]
    assert status["workers"]["succeeded"] == 2
    deadline = time.monotonic() + 30
    while (status.get("progress") or {}).get("epoch") != 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        status = json.loads(cluster.kubectl("-n", namespace, "get", "tj", "real", "-o", "json"))["status"]
    assert status["progress"]["epoch"] == 2 and status["progress"]["epochs"] == 2, status
    assert status["progress"]["loss"] > 0 and status["progress"]["validationLoss"] > 0
    assert list((tmp_path / "volumes").glob("*/real/model.pt")), "rank 0 wrote the model to the output volume"


def test_a_data_error_under_torchrun_fails_the_job_at_once_with_code_3(
    cluster: Cluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    """torchrun exits 1 for the failed child; the trainer's record in the termination message says 3."""
    manifest = {
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "nodata"},
        "spec": {
            "image": "registry.local/kubetrain-trainer:test",
            "workers": 1,
            "nprocPerWorker": 2,
            "trainer": {
                "device": "cpu",
                "data": {"dataset": "imagefolder", "root": "/data/missing"},
                "output_dir": "/output",
            },
            "storage": [
                {"name": "data", "mountPath": "/data", "emptyDir": {}},
                {"name": "output", "mountPath": "/output", "emptyDir": {}},
            ],
            "runPolicy": {"maxRestarts": 2},
            "podAnnotations": {REAL_ANNOTATION: "true"},
        },
    }
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(manifest))
    kubelet = RealKubelet(cluster, tmp_path)
    exit_codes = kubelet.run(namespace, "kubetrain.io/job-name=nodata", expected=1)
    assert list(exit_codes.values()) == [1], "torchrun's own exit code"

    cluster.kubectl("-n", namespace, "wait", "--for=condition=Failed", "tj/nodata", "--timeout=60s")
    status = json.loads(cluster.kubectl("-n", namespace, "get", "tj", "nodata", "-o", "json"))["status"]
    assert status["restarts"] == 0
    assert status["lastFailure"]["exitCode"] == 3, status
    assert "NonRetryableExitCode" in json.dumps(status["conditions"])
