"""The oldest Kubernetes the chart declares (Chart.yaml's kubeVersion), tested on its own control plane.

The suite runs on Kubernetes 1.37. A user's cluster is often older, and older API servers differ where
kubetrain depends on them: which CEL libraries CRD rules may use, which Job fields they know. Here the
oldest supported version's kube-apiserver, kube-controller-manager and kube-scheduler (built once from
the Go module proxy, then cached) run with the suite's etcd and kwok. On that cluster the refusal and
acceptance tables, a chart install and a TrainingJob's lifecycle (a retried failure and an eviction)
must all hold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from chartkit import CHART_DIR, Chart
from testcluster import binaries, refusals
from testcluster.cluster import Cluster, start_cluster
from testcluster.manifests import trainingjob
from testcluster.operator_process import OperatorProcess
from testcluster.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def oldest() -> Iterator[Cluster]:
    """Two kwok nodes under the oldest supported control plane (no Workload API: it came later)."""
    control_plane = binaries.ensure_oldest_control_plane()
    cluster = start_cluster(nodes=2, workload_api=False, control_plane=control_plane)
    try:
        yield cluster
    finally:
        cluster.stop_and_verify()


@pytest.fixture
def oldest_namespace(oldest: Cluster) -> Iterator[str]:
    with oldest.temporary_namespace("old") as name:
        yield name


def test_the_chart_declares_the_oldest_version_the_suite_runs_and_the_cluster_is_that_version(
    oldest: Cluster,
) -> None:
    declared = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["kubeVersion"]
    oldest_minor = re.match(r"v(\d+)\.(\d+)\.", binaries.OLDEST_KUBERNETES_VERSION)
    assert oldest_minor is not None
    assert declared == f">={oldest_minor[1]}.{oldest_minor[2]}.0-0", declared
    server = json.loads(oldest.kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
    assert server == binaries.OLDEST_KUBERNETES_VERSION


def test_every_bad_trainingjob_is_refused_on_the_oldest_kubernetes_naming_its_field(
    oldest: Cluster, oldest_namespace: str
) -> None:
    wrong = refusals.wrong_refusals(oldest, oldest_namespace)
    assert not wrong, "\n".join(wrong)


def test_every_valid_trainingjob_and_its_worker_job_pass_the_oldest_kubernetes(
    oldest: Cluster, oldest_namespace: str
) -> None:
    wrong = refusals.wrong_acceptances(oldest, oldest_namespace)
    assert not wrong, "\n".join(wrong)


def test_the_chart_installs_on_the_oldest_kubernetes_and_its_operator_pod_runs(
    oldest: Cluster, oldest_namespace: str, helm_bin: Path, tmp_path: Path
) -> None:
    """helm checks kubeVersion against the live cluster; the CRD, the RBAC and the
    ValidatingAdmissionPolicy must all be accepted by the older API server."""
    chart = Chart(oldest, helm_bin, tmp_path)
    release = "oldest"
    output = chart.install(release, oldest_namespace, {"watchNamespaces": [oldest_namespace]})
    try:
        assert "STATUS: deployed" in output, output
        oldest.kubectl(
            "wait", "--for=condition=Established", "crd/trainingjobs.kubetrain.io", "--timeout=60s"
        )
        policies = oldest.kubectl("get", "validatingadmissionpolicies", "-o", "name")
        assert "kubetrain" in policies, policies
        oldest.kubectl(
            "-n", oldest_namespace, "rollout", "status", f"deployment/{release}-kubetrain", "--timeout=120s"
        )
    finally:
        chart.run("uninstall", release, "--namespace", oldest_namespace, check=False)


def test_a_trainingjob_retries_a_failure_and_shrugs_off_an_eviction_on_the_oldest_kubernetes(
    oldest: Cluster, oldest_namespace: str, tmp_path: Path
) -> None:
    """The operator on the older API server: a worker that fails once (exit 17) costs one counted restart;
    a worker evicted through the Eviction API in the next attempt costs a disruption restart only (the
    Job's podFailurePolicy on DisruptionTarget), and the job succeeds."""
    operator = OperatorProcess(oldest, tmp_path / "operator.log", extra_args=("--resync-seconds", "2"))
    operator.start()
    try:
        controls = {
            "sim.kubetrain.io/exit-code": "17",
            "sim.kubetrain.io/fail-attempt": "0",
            "sim.kubetrain.io/run-for": "20s",
        }
        manifest = trainingjob("lifecycle", workers=2, annotations=controls)
        manifest["spec"]["runPolicy"] = {"maxRestarts": 1}
        oldest.kubectl("-n", oldest_namespace, "apply", "-f", "-", input_text=json.dumps(manifest))

        def status() -> dict:
            body = oldest.kubectl("-n", oldest_namespace, "get", "trainingjob", "lifecycle", "-o", "json")
            return json.loads(body).get("status") or {}

        def running_attempt_1_worker() -> str | None:
            pods = json.loads(
                oldest.kubectl(
                    "-n", oldest_namespace, "get", "pods", "-o", "json",
                    "-l", "kubetrain.io/job-name=lifecycle,kubetrain.io/restart-attempt=1",
                )
            )["items"]  # fmt: skip
            names = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
            return names[0] if len(names) == 2 else None

        victim = wait_for(
            running_attempt_1_worker, "attempt 1's workers Running", 120, explain=operator.log_tail
        )
        assert status()["restarts"] == 1
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": victim}}
        oldest.kubectl(
            "create", "--raw", f"/api/v1/namespaces/{oldest_namespace}/pods/{victim}/eviction", "-f", "-",
            input_text=json.dumps(eviction),
        )  # fmt: skip
        done = wait_for(
            lambda: (s := status()).get("phase") == "Succeeded" and s,
            "Succeeded after a failure and an eviction",
            180,
            explain=operator.log_tail,
        )
        assert (done["restarts"], done["disruptionRestarts"], done["restartAttempt"]) == (1, 1, 2), done
    finally:
        operator.stop()
