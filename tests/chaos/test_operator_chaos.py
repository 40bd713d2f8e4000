"""The operator under faults, on the chaos suite's own control plane (kwok plays the kubelet).

Sized for 2 CPU cores shared with the rest of the suite: tens of TrainingJobs of 2 workers per test,
not the hundreds of the benchmark (benchmarks/operator_scale.py); every random choice is seeded.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from chaos_support import (
    StatusHistory,
    all_in_phase,
    statuses,
    submit,
    trainingjob,
    wait_until,
)
from testcluster.cluster import Cluster
from testcluster.manifests import refused_cases
from testcluster.operator_process import CRD_FILE, CreationCounter, OperatorProcess, install_crd

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SEED = 20261202
WORKERS = 2


def _children_created(counter: CreationCounter, namespace: str, kind: str) -> list[tuple[str, str, str]]:
    return [key for key in counter.created if key[0] == kind and key[1] == namespace]


def _restarts(current: dict[str, dict[str, Any]], names: list[str]) -> dict[str, int]:
    return {name: int(current[name].get("restarts") or 0) for name in names}


def test_operator_sigkilled_ten_times_at_random_moments(
    chaos_cluster: Cluster, chaos_namespace: str, operator_factory: Callable[..., OperatorProcess]
) -> None:
    rng = random.Random(SEED)
    jobs = 100
    names = [f"kill-{index:03d}" for index in range(jobs)]
    counter = CreationCounter(chaos_cluster)
    counter.start()
    history = StatusHistory(chaos_cluster, chaos_namespace).start()
    operator = operator_factory()
    try:
        # Pods end at different moments (2-12 s), so kills land while children are being created, while
        # workers start and while jobs finish.
        manifests = [
            trainingjob(
                name, workers=WORKERS, annotations={"sim.kubetrain.io/run-for": f"{rng.randint(2, 12)}s"}
            )
            for name in names
        ]
        submit(chaos_cluster, chaos_namespace, manifests)
        kills = []
        for _ in range(10):
            pause = rng.uniform(0.5, 4.0)
            time.sleep(pause)
            kills.append(round(pause, 2))
            operator.kill()
            operator.start()
        wait_until(
            all_in_phase(chaos_cluster, chaos_namespace, names, "Succeeded"),
            300,
            f"all {jobs} TrainingJobs Succeeded after SIGKILLs at intervals {kills}",
            operator,
        )
    finally:
        counter.stop()
        history.stop()
    assert not counter.duplicates(), counter.duplicates()
    assert len(_children_created(counter, chaos_namespace, "Job")) == jobs * WORKERS
    assert len(_children_created(counter, chaos_namespace, "Service")) == jobs
    assert not history.regressions(), history.regressions()
    assert set(_restarts(statuses(chaos_cluster, chaos_namespace), names).values()) == {0}


def test_api_server_restarted_mid_run_the_operator_reconnects_and_every_job_finishes(
    chaos_cluster: Cluster, chaos_namespace: str, operator_factory: Callable[..., OperatorProcess]
) -> None:
    rng = random.Random(SEED + 1)
    names = [f"outage-{index:03d}" for index in range(20)]
    operator = operator_factory()
    counter = CreationCounter(chaos_cluster)
    counter.start()
    history = StatusHistory(chaos_cluster, chaos_namespace).start()
    try:
        submit(
            chaos_cluster,
            chaos_namespace,
            [
                trainingjob(
                    name, workers=WORKERS, annotations={"sim.kubetrain.io/run-for": f"{rng.randint(6, 15)}s"}
                )
                for name in names
            ],
        )
        # Mid-run: some jobs running, some children perhaps still being created.
        wait_until(
            lambda: (
                sum(s.get("phase") == "Running" for s in statuses(chaos_cluster, chaos_namespace).values())
                >= 5
            ),
            120,
            "five TrainingJobs Running",
            operator,
        )
        operator_pid = operator._process.pid if operator._process else None
        chaos_cluster.stop_component("kube-apiserver")
        time.sleep(8)  # the operator's watches and requests fail meanwhile
        assert operator.running, f"the operator exited while the API server was away:\n{operator.log_tail()}"
        chaos_cluster.start_component("kube-apiserver")
        wait_until(
            all_in_phase(chaos_cluster, chaos_namespace, names, "Succeeded"),
            240,
            "every TrainingJob Succeeded after the API server came back",
            operator,
        )
    finally:
        counter.stop()
        history.stop()
    assert operator.running and operator._process is not None and operator._process.pid == operator_pid, (
        "the operator must reconnect by itself, not be restarted"
    )
    assert not counter.duplicates(), counter.duplicates()
    assert not history.regressions(), history.regressions()
    assert set(_restarts(statuses(chaos_cluster, chaos_namespace), names).values()) == {0}


def test_ten_percent_of_worker_pods_fail_once_and_only_their_jobs_restart_once(
    chaos_cluster: Cluster, chaos_namespace: str, operator_factory: Callable[..., OperatorProcess]
) -> None:
    rng = random.Random(SEED + 2)
    jobs = 30
    names = [f"flaky-{index:03d}" for index in range(jobs)]
    # Annotations apply to every worker of a TrainingJob, so failing every worker of 10% of the jobs makes
    # 10% of the worker pods fail, each exactly once (on restart attempt 0).
    affected = sorted(rng.sample(names, jobs // 10))
    manifests = []
    for name in names:
        controls = {"sim.kubetrain.io/run-for": f"{rng.randint(2, 8)}s"}
        if name in affected:
            controls |= {"sim.kubetrain.io/exit-code": "17", "sim.kubetrain.io/fail-attempt": "0"}
        manifests.append(trainingjob(name, workers=WORKERS, annotations=controls))
    operator = operator_factory()
    counter = CreationCounter(chaos_cluster)
    counter.start()
    history = StatusHistory(chaos_cluster, chaos_namespace).start()
    try:
        submit(chaos_cluster, chaos_namespace, manifests)
        wait_until(
            all_in_phase(chaos_cluster, chaos_namespace, names, "Succeeded"),
            300,
            "every TrainingJob Succeeded",
            operator,
        )
    finally:
        counter.stop()
        history.stop()
    restarts = _restarts(statuses(chaos_cluster, chaos_namespace), names)
    assert {name: restarts[name] for name in affected} == dict.fromkeys(affected, 1)
    assert {name for name, count in restarts.items() if count} == set(affected)
    assert not counter.duplicates(), counter.duplicates()
    created = _children_created(counter, chaos_namespace, "Job")
    for name in names:
        attempts = 2 if name in affected else 1
        own = [key for key in created if key[2].startswith(f"{name}-r")]
        assert len(own) == attempts * WORKERS, (name, sorted(own))
    assert not history.regressions(), history.regressions()
    for name in affected:  # the group restarted: every worker of attempt 0 went, all of attempt 1 came
        assert {key[2] for key in created if key[2].startswith(f"{name}-r1-")} == {
            f"{name}-r1-w{index}" for index in range(WORKERS)
        }


def _loose_crd() -> dict[str, Any]:
    """The real CRD with a spec schema that accepts anything, as an older, looser version might have (and
    no scale subresource: the API server reads spec.workers as an integer for it)."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    loose = copy.deepcopy(crd)
    for version in loose["spec"]["versions"]:
        properties = version["schema"]["openAPIV3Schema"]["properties"]
        properties["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        version["schema"]["openAPIV3Schema"].pop("x-kubernetes-validations", None)
        version.pop("additionalPrinterColumns", None)
        version.get("subresources", {}).pop("scale", None)
    return loose


def _create_retrying(cluster: Cluster, namespace: str, manifests: list[dict[str, Any]]) -> None:
    """The API server takes a moment to serve a changed CRD schema: retry until the loose one accepts."""
    deadline = time.monotonic() + 60
    pending = list(manifests)
    while pending:
        result = cluster.run_kubectl("-n", namespace, "create", "-f", "-", input_text=json.dumps(pending[0]))
        if result.returncode == 0 or "AlreadyExists" in result.stderr:
            pending.pop(0)
            continue
        assert time.monotonic() < deadline, result.stderr
        time.sleep(0.5)


def _install_real_crd(cluster: Cluster, namespace: str, probe: dict[str, Any]) -> None:
    """Reinstall the real CRD and wait until the API server enforces it (it refuses `probe` again)."""
    install_crd(cluster)
    deadline = time.monotonic() + 60
    while True:
        result = cluster.run_kubectl(
            "-n", namespace, "create", "--dry-run=server", "-f", "-", input_text=json.dumps(probe)
        )
        if result.returncode != 0:
            return
        assert time.monotonic() < deadline, "the real CRD's schema is not enforced after 60s"
        time.sleep(0.5)


def _refuses_writes(cluster: Cluster, namespace: str, name: str) -> bool:
    """Whether the API server refuses every write to the stored object (not only to its spec)."""
    result = cluster.run_kubectl(
        "-n", namespace, "annotate", "--dry-run=server", "trainingjob", name, "kubetrain.test/probe=1"
    )
    return result.returncode != 0 and "Invalid" in result.stderr


def _true_condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next(
        (c for c in status.get("conditions") or () if c["type"] == type_ and c["status"] == "True"), None
    )


def _event(cluster: Cluster, namespace: str, name: str, reason: str) -> dict[str, Any]:
    """The newest event with `reason` about TrainingJob `name`, as {"reason", "message"}; {} if none."""
    events = json.loads(
        cluster.kubectl(
            "-n", namespace, "get", "events", "-o", "json",
            "--field-selector", f"involvedObject.name={name},reason={reason}",
        )
    )["items"]  # fmt: skip
    if not events:
        return {}
    return {"reason": events[-1]["reason"], "message": events[-1]["message"]}


def _absent(obj: dict[str, Any], field: str) -> bool:
    """Whether `field` (a dotted path from the object's root) is missing from the object as served: an
    unknown field the API server prunes under the tightened schema. Such an object is valid as served, and
    an operator that saw it pruned rightly runs it. (Observed here: the operator's watch, opened under the
    tight schema, delivered objects written under the loose one without their unknown fields, where the
    earlier GET-per-reconcile operator had seen the fields and failed the jobs.)"""
    node: Any = obj
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            return True
        node = node[part]
    return False


def _names_the_field(message: str, field: str) -> bool:
    """The field's name, or the path of the object holding it (an unknown key the API server pruned
    leaves its parent to blame), written as the operator writes paths: spec.env[0].valueFrom."""
    parts = [part for part in field.replace("[", ".").replace("]", "").split(".") if not part.isdigit()]
    return parts[-1] in message or (len(parts) > 2 and field.rpartition(".")[0] in message)


def test_objects_the_operator_cannot_understand_fail_naming_the_field_and_others_go_on(
    chaos_cluster: Cluster, chaos_namespace: str, operator_factory: Callable[..., OperatorProcess]
) -> None:
    # A TrainingJob whose spec.managedBy names another controller is that controller's to judge: the
    # operator never reads its spec (test_managed_by), so it gives no verdict here.
    cases = [case for case in refused_cases() if "managedBy" not in case.manifest["spec"]]
    documents = [case.manifest for case in cases]
    expected = {case.name: case.field for case in cases}
    first, second = documents[: len(documents) - 4], documents[len(documents) - 4 :]
    good = [f"good-{index:02d}" for index in range(8)]
    probe = {**documents[0], "metadata": {"name": "schema-probe"}}
    try:
        # Written under an older, looser schema; then the schema tightens (the real CRD) before the operator
        # ever sees them.
        chaos_cluster.apply(_loose_crd())
        _create_retrying(chaos_cluster, chaos_namespace, first)
        _install_real_crd(chaos_cluster, chaos_namespace, probe)
        operator = operator_factory()
        submit(chaos_cluster, chaos_namespace, [trainingjob(name, workers=WORKERS) for name in good[:4]])
        # And while it runs: loosen, write more, tighten again.
        chaos_cluster.apply(_loose_crd())
        _create_retrying(chaos_cluster, chaos_namespace, second)
    finally:
        _install_real_crd(chaos_cluster, chaos_namespace, probe)
    submit(chaos_cluster, chaos_namespace, [trainingjob(name, workers=WORKERS) for name in good[4:]])
    pid = operator._process.pid if operator._process else None

    stored = {
        item["metadata"]["name"]: item
        for item in json.loads(
            chaos_cluster.kubectl("-n", chaos_namespace, "get", "trainingjobs", "-o", "json")
        )["items"]
    }
    wait_until(
        all_in_phase(chaos_cluster, chaos_namespace, good, "Succeeded"), 180, "good jobs Succeeded", operator
    )
    # Unknown fields written under the loose schema are pruned from the object as served once the schema
    # tightens, and a watch opened under the tight schema may deliver them pruned even in between: an
    # operator that saw such a job pruned runs it (verdict "Pruned"); one that saw the field fails it naming it,
    # or, when it had already started it pruned, holds it (SpecRefused naming the field, workers left).
    # A value whose type no longer matches a field with a transition rule (spec.workers is immutable)
    # makes the API server refuse every write to the object, status included: for those the operator can
    # only say so in a Warning event, and must stop retrying until someone edits the object.
    refused = {name for name in expected if _refuses_writes(chaos_cluster, chaos_namespace, name)}

    def verdicts() -> dict[str, dict[str, Any]]:
        current = statuses(chaos_cluster, chaos_namespace)
        out = {}
        for name, field in expected.items():
            if name in refused:
                out[name] = _event(chaos_cluster, chaos_namespace, name, "InvalidSpec")
            elif held := _true_condition(current.get(name, {}), "SpecRefused"):
                out[name] = {**held, "held": True}
            elif current.get(name, {}).get("phase") == "Failed":
                out[name] = _true_condition(current[name], "Failed") or {}
            elif current.get(name, {}).get("phase") == "Succeeded" and _absent(stored[name], field):
                out[name] = {"reason": "Pruned"}
        return out

    wait_until(lambda: len(verdicts()) == len(expected), 120, "every invalid job judged", operator)
    problems = []
    for name, verdict in verdicts().items():
        field = expected[name]
        if verdict.get("reason") == "Pruned":
            continue
        if verdict.get("reason") != "InvalidSpec" or not _names_the_field(verdict.get("message", ""), field):
            problems.append(
                f"{name}: expected InvalidSpec naming {field!r}, got {verdict} (spec {stored[name]['spec']})"
            )
    log = operator.log_tail(100000).splitlines()
    retried = [
        line
        for line in log
        if any(f"reconcile of {chaos_namespace}/{name} failed" in line for name in expected)
    ]
    assert not retried, "the operator kept retrying objects it cannot understand:\n" + "\n".join(retried[:10])
    assert not problems, "\n".join(problems)
    # No worker was ever created for a job judged invalid before it started, and the operator never restarted.
    judged_invalid = {
        name
        for name, verdict in verdicts().items()
        if verdict.get("reason") != "Pruned" and not verdict.get("held")
    }
    jobs = json.loads(chaos_cluster.kubectl("-n", chaos_namespace, "get", "jobs", "-o", "json"))["items"]
    owners = {job["metadata"]["labels"]["kubetrain.io/job-name"] for job in jobs}
    assert not owners & judged_invalid, owners & judged_invalid
    assert operator.running and operator._process is not None and operator._process.pid == pid
