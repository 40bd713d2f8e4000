"""Bad TrainingJobs are refused at `kubectl apply` by the real API server, naming their own field.

The cases are the table tests/operator/testdata/refused-trainingjobs.yaml. They go to the API server in
one `kubectl apply` (one process, a GET and a POST per object), so the whole table takes seconds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from testcluster import refusals
from testcluster.cluster import Cluster
from testcluster.manifests import trainingjob
from testcluster.operator_process import OperatorProcess
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster


def test_every_bad_trainingjob_is_refused_at_apply_naming_its_own_field_and_nothing_is_created(
    cluster: Cluster, namespace: str
) -> None:
    wrong = refusals.wrong_refusals(cluster, namespace)
    assert not wrong, "\n".join(wrong)


def test_valid_trainingjobs_using_every_field_are_accepted_and_so_are_their_worker_jobs(
    cluster: Cluster, namespace: str
) -> None:
    """The rules refuse only what is wrong: every field in its edge forms passes, and the worker Job the
    operator builds from it passes the API server's own validation (nothing is stored: dry run)."""
    wrong = refusals.wrong_acceptances(cluster, namespace)
    assert not wrong, "\n".join(wrong)


def test_a_spec_only_the_worker_job_refuses_fails_naming_the_trainingjobs_field_and_claims_no_worker(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """affinity passes through unchecked: the API server refuses the worker Job, and the operator says so
    in the TrainingJob's terms (spec.affinity..., not spec.template.spec.affinity...) without ever
    claiming that workers were created."""
    terms = "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    manifest = trainingjob(
        "bad-affinity",
        affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
        },
    )
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(manifest))

    def failed() -> dict[str, Any] | None:
        body = json.loads(
            cluster.kubectl("-n", namespace, "get", "trainingjob", "bad-affinity", "-o", "json")
        )
        status = body.get("status") or {}
        return status if status.get("phase") == "Failed" else None

    status = wait_for(failed, "the TrainingJob to fail", 60, explain=operator.log_tail)
    condition = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "InvalidSpec"
    assert f"spec.affinity.{terms}" in condition["message"] and "template" not in condition["message"]
    assert all(c["type"] != "Created" or c["status"] != "True" for c in status["conditions"]), status
    assert cluster.kubectl("-n", namespace, "get", "jobs", "-o", "name") == ""
