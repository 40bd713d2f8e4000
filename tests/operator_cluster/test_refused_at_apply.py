"""Bad TrainingJobs are refused at `kubectl apply` by the real API server, naming their own field.

The cases are the table tests/operator/testdata/refused-trainingjobs.yaml. They go to the API server in
one `kubectl apply` (one process, a GET and a POST per object), so the whole table takes seconds.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml
from kubetrain_operator import api
from kubetrain_operator.planning import builders
from testcluster.cluster import Cluster
from testcluster.manifests import accepted_trainingjobs, refused_cases, trainingjob
from testcluster.operator_process import OperatorProcess, install_crd
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster

NOISE = "some validation rules were not checked"
"""The API server's note that it skipped every CEL rule because the object's shape is wrong."""
SHAPE_ERRORS = ("Unsupported value", "Required value", "Too long", "must be of type")
"""The schema errors after which the API server skips the CEL rules (and says NOISE): an unknown enum
value, a missing required field, a string over maxLength, a value of the wrong type."""
BROKEN_RULE = (
    "evaluating rule",
    "messageExpression",
    "did not match a supported operator",
    "no further validation rules",
    "Internal error",
)
"""What the API server says when a rule or its messageExpression fails to evaluate: the user would see
the rule's fallback message or an evaluation error instead of what to change."""


def _refusals(stderr: str) -> list[str]:
    """kubectl's error lines, one per refused object, in the order the objects were sent. Most name their
    object; a strict decoding error (an unknown field) does not, hence the order."""
    return [line for line in stderr.splitlines() if line.startswith("Error from server")]


def test_every_bad_trainingjob_is_refused_at_apply_naming_its_own_field_and_nothing_is_created(
    cluster: Cluster, namespace: str
) -> None:
    install_crd(cluster)
    cases = refused_cases()
    started = time.monotonic()
    result = cluster.run_kubectl(
        "-n", namespace, "apply", "-f", "-", input_text=yaml.safe_dump_all([case.manifest for case in cases])
    )
    took = time.monotonic() - started
    print(f"{len(cases)} refusals in {took:.1f} s")
    assert result.stdout == "", f"accepted: {result.stdout}"
    refusals = _refusals(result.stderr)
    assert len(refusals) == len(cases), result.stderr
    wrong = []
    for case, refusal in zip(cases, refusals, strict=True):
        if f'"{case.name}"' not in refusal and "strict decoding error" not in refusal:
            wrong.append(f"{case.name}: refusals out of order, this one is about another object: {refusal}")
        if case.field not in refusal:
            wrong.append(f"{case.name}: expected {case.field!r} in: {refusal}")
        if any(marker in refusal for marker in BROKEN_RULE):
            wrong.append(f"{case.name}: a rule failed to evaluate: {refusal}")
        if NOISE in refusal and not any(kind in refusal for kind in SHAPE_ERRORS):
            wrong.append(f"{case.name}: rules skipped without a shape error: {refusal}")
    assert not wrong, "\n".join(wrong)
    leftovers = cluster.kubectl("-n", namespace, "get", "trainingjobs,jobs,services,pods", "-o", "name")
    assert leftovers == ""


def test_valid_trainingjobs_using_every_field_are_accepted_and_so_are_their_worker_jobs(
    cluster: Cluster, namespace: str
) -> None:
    """The rules refuse only what is wrong: every field in its edge forms passes, and the worker Job the
    operator builds from it passes the API server's own validation (nothing is stored: dry run)."""
    install_crd(cluster)
    manifests = accepted_trainingjobs()
    jobs = [
        builders.build_worker_job(
            builders.Context(
                owner=builders.Owner(
                    m["metadata"]["name"], namespace, "00000000-0000-0000-0000-000000000000"
                ),
                spec=api.TrainingJobSpec.model_validate(m["spec"]),
            ),
            0,
        )
        for m in manifests
    ]
    for job in jobs:
        del job["metadata"]["ownerReferences"]  # the owner does not exist: a dry run checks the Job only
    result = cluster.run_kubectl(
        "-n",
        namespace,
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        input_text=yaml.safe_dump_all([*manifests, *jobs]),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(manifests) + len(jobs), result.stdout
    assert json.loads(cluster.kubectl("-n", namespace, "get", "trainingjobs", "-o", "json"))["items"] == []


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
