"""Helpers shared by the chart tests: rendering the chart with helm, and the operator's RBAC needs.

`OPERATOR_NEEDS` is the one list of (API group, resource, verb) the operator and kopf use in a watched
namespace. The render tests check the chart grants each of them and nothing more; the cluster tests ask
the API server, with the chart's ServiceAccount token, whether each one is allowed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from testcluster.binaries import KUBERNETES_VERSION
from testcluster.cluster import Cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "kubetrain"

OPERATOR_NEEDS: tuple[tuple[str, str, str], ...] = (
    # The TrainingJob: kopf lists and watches it into the operator's cache; the controller deletes it after
    # ttlSecondsAfterFinished. Status: merge patches only. Nothing else is written on it.
    *(("kubetrain.io", "trainingjobs", verb) for verb in ("get", "list", "watch", "delete")),
    ("kubetrain.io", "trainingjobs/status", "patch"),
    # Never a request: children set blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
    # admission plugin allows only to who may update the owner's finalizers.
    ("kubetrain.io", "trainingjobs/finalizers", "update"),
    # One batch Job per worker and one headless Service per TrainingJob: watched into the cache, created
    # and deleted by the controller; read one by one only when a create answers 409 AlreadyExists.
    *(("batch", "jobs", verb) for verb in ("get", "list", "watch", "create", "delete")),
    *(("", "services", verb) for verb in ("get", "list", "watch", "create", "delete")),
    # Pods are only watched (exit codes, readiness, why Pending); they go away with their Jobs.
    *(("", "pods", verb) for verb in ("list", "watch")),
    # kopf and the controller post core v1 Events on every transition.
    ("", "events", "create"),
    # spec.gangScheduling (every provider by default): kubernetes, one Workload per TrainingJob and one
    # PodGroup per restart attempt, deleted with the attempt's Jobs; volcano and scheduler-plugins, one
    # PodGroup per TrainingJob. `get` only when a create answers 409.
    *(("scheduling.k8s.io", "workloads", verb) for verb in ("get", "create")),
    *(("scheduling.k8s.io", "podgroups", verb) for verb in ("get", "create", "delete")),
    *(
        (group, "podgroups", verb)
        for group in ("scheduling.volcano.sh", "scheduling.x-k8s.io")
        for verb in ("get", "create")
    ),
)

KUEUE_NEEDS: tuple[tuple[str, str, str], ...] = (
    # kueue.enabled: one Workload per queued TrainingJob, watched into the cache, created, its spec.active
    # and status (released after eviction, Finished) merge-patched.
    *(("kueue.x-k8s.io", "workloads", verb) for verb in ("get", "list", "watch", "create", "patch")),
    ("kueue.x-k8s.io", "workloads/status", "patch"),
)
KUEUE_CLUSTER_NEEDS: tuple[tuple[str, str, str], ...] = (
    *(("kueue.x-k8s.io", "resourceflavors", verb) for verb in ("list", "watch")),
    ("kueue.x-k8s.io", "workloadpriorityclasses", "get"),
    ("scheduling.k8s.io", "priorityclasses", "get"),
)
"""kueue.enabled, cluster-scoped: flavors' node labels and tolerations, the priority a queued job names."""

CRD_SCANS: tuple[tuple[str, str, str], ...] = tuple(
    ("apiextensions.k8s.io", "customresourcedefinitions", verb) for verb in ("list", "watch")
)
"""Never granted: the operator scans no CRDs (kopf, which would, handles no objects)."""

WORKER_IDENTITY_NEEDS: tuple[tuple[str, str, str], ...] = (
    ("", "serviceaccounts", "create"),
    ("rbac.authorization.k8s.io", "rolebindings", "create"),
)
"""Only when watching all namespaces with the worker ServiceAccount (the default): the operator creates
the workers' account and its RoleBinding where workers run; create only, never read, change or delete."""

WORKER_ROLE_NEEDS_BY_NAME = tuple(
    ("rbac.authorization.k8s.io", "clusterroles", verb) for verb in ("get", "bind")
)
"""The same: the workers' ClusterRole, by name, is the one role the operator may bind (and read, for its uid)."""

LEADER_NEEDS_BY_NAME = tuple(("coordination.k8s.io", "leases", verb) for verb in ("get", "update"))
"""Leader election: the chart creates the Lease; the operator reads and renews that one object by name."""

NOT_NEEDED: tuple[tuple[str, str, str], ...] = (
    ("kubetrain.io", "trainingjobs", "patch"),
    ("kubetrain.io", "trainingjobs", "update"),
    ("batch", "jobs", "patch"),
    ("", "pods", "delete"),
    ("", "pods", "patch"),
    ("", "services", "patch"),
    ("kubetrain.io", "trainingjobs", "create"),
    ("", "events", "delete"),
)
"""Verbs on the operator's own resources that it does not use, so the chart must not grant them."""

FORBIDDEN_RESOURCES = ("secrets", "configmaps", "serviceaccounts", "roles", "rolebindings", "nodes")
"""What a compromised operator must not reach: credentials, config, identities, RBAC, nodes."""


def helm(helm_bin: Path, *args: str, check: bool = True, env: dict[str, str] | None = None) -> str:
    """Run helm and return stdout; on failure raise with helm's stderr in the message. An offline
    `helm template` renders for the suite's Kubernetes: without a cluster helm assumes v1.20, which the
    chart's kubeVersion refuses."""
    if args[:1] == ("template",) and "--kube-version" not in args:
        args = (*args, "--kube-version", KUBERNETES_VERSION)
    result = subprocess.run(
        [str(helm_bin), *args], capture_output=True, text=True, timeout=180, check=False, env=env
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result.stdout if check else result.stdout + result.stderr


def values_file(directory: Path, values: dict[str, Any]) -> Path:
    """Write `values` to a file for `helm -f` (exact types, unlike --set's string guessing)."""
    path = directory / f"values-{len(list(directory.glob('values-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def render(
    helm_bin: Path,
    directory: Path,
    values: dict[str, Any] | None = None,
    *,
    release: str = "kt",
    namespace: str = "kubetrain-system",
    include_crds: bool = False,
) -> list[dict[str, Any]]:
    """The objects `helm template` renders for `values`, as dicts (empty documents dropped)."""
    args = ["template", release, str(CHART_DIR), "--namespace", namespace]
    if values:
        args += ["-f", str(values_file(directory, values))]
    if include_crds:
        args.append("--include-crds")
    return [doc for doc in yaml.safe_load_all(helm(helm_bin, *args)) if doc]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj.get("kind") == kind]


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matching = of_kind(objects, kind)
    assert len(matching) == 1, f"expected exactly one {kind}, got {len(matching)}"
    return matching[0]


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) triple a list of RBAC rules grants, wildcards kept as '*'."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def operator_objects(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The objects of `kind` that belong to the operator (not to the workers' identity)."""
    return [
        obj
        for obj in of_kind(objects, kind)
        if obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "operator"
    ]


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = only(objects, "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


# --- Dockerfiles


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    pairs = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def last_stage(dockerfile: Path) -> list[tuple[str, str]]:
    steps = instructions(dockerfile)
    starts = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    return steps[starts[-1] :]


def exec_form(dockerfile: Path, keyword: str) -> list[str]:
    """The JSON (exec) form of ENTRYPOINT or CMD in the final stage; shell form is refused."""
    values = [rest for key, rest in last_stage(dockerfile) if key == keyword]
    if not values:
        return []
    parsed = json.loads(values[-1])
    assert isinstance(parsed, list) and all(isinstance(part, str) for part in parsed), values[-1]
    return parsed


class Chart:
    """helm against the test cluster, with helm's own state in a temporary directory."""

    def __init__(self, cluster: Cluster, helm_bin: Path, directory: Path) -> None:
        self.cluster = cluster
        self.helm_bin = helm_bin
        self.directory = directory
        self.env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "HELM_CACHE_HOME": str(directory / "cache"),
            "HELM_CONFIG_HOME": str(directory / "config"),
            "HELM_DATA_HOME": str(directory / "data"),
        }

    def run(self, *args: str, check: bool = True) -> str:
        return helm(self.helm_bin, *args, check=check, env=self.env)

    def install(self, release: str, namespace: str, values: dict[str, Any], *, upgrade: bool = False) -> str:
        verb = ["upgrade"] if upgrade else ["install"]
        return self.run(
            *verb,
            release,
            str(CHART_DIR),
            "--namespace",
            namespace,
            "-f",
            str(values_file(self.directory, values)),
        )

    def uninstall(self, release: str, namespace: str) -> str:
        return self.run("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s")
