"""The refusal and acceptance tables (tests/operator/testdata/) sent to a real API server, each in one
`kubectl apply`, and what is wrong with its answers: checked on the suite's cluster and on the oldest
Kubernetes the chart declares."""

from __future__ import annotations

import json
import time

import yaml
from kubetrain_operator import api
from kubetrain_operator.planning import builders

from testcluster.cluster import Cluster
from testcluster.manifests import accepted_trainingjobs, refused_cases
from testcluster.operator_process import install_crd

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


def wrong_refusals(cluster: Cluster, namespace: str) -> list[str]:
    """Apply every case of the table at once; each must be refused naming its own field, no rule may fail
    to evaluate, and nothing may be created. Returns what was wrong, one line per problem."""
    install_crd(cluster)
    cases = refused_cases()
    started = time.monotonic()
    result = cluster.run_kubectl(
        "-n", namespace, "apply", "-f", "-", input_text=yaml.safe_dump_all([case.manifest for case in cases])
    )
    print(f"{len(cases)} refusals in {time.monotonic() - started:.1f} s")
    if result.stdout:
        return [f"accepted: {result.stdout}"]
    refusals = _refusals(result.stderr)
    if len(refusals) != len(cases):
        return [f"{len(refusals)} refusals for {len(cases)} cases:\n{result.stderr}"]
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
    leftovers = cluster.kubectl("-n", namespace, "get", "trainingjobs,jobs,services,pods", "-o", "name")
    if leftovers:
        wrong.append(f"created all the same: {leftovers}")
    return wrong


def wrong_acceptances(cluster: Cluster, namespace: str) -> list[str]:
    """Every valid TrainingJob of the accepted table, and the worker Job the operator builds from each, in
    one server-side dry run: all must pass (nothing is stored). Returns what was wrong."""
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
    if result.returncode != 0:
        return [result.stderr]
    if result.stdout.count("(server dry run)") != len(manifests) + len(jobs):
        return [f"not every object passed the dry run: {result.stdout}"]
    stored = json.loads(cluster.kubectl("-n", namespace, "get", "trainingjobs", "-o", "json"))["items"]
    return [f"a dry run stored {len(stored)} TrainingJobs"] if stored else []
