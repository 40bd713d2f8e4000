"""docs/migrating.md's translated manifests: each is a file the guide shows verbatim, valid under the
models, and run as written by the operator on a test cluster until its workers are Running.

The cluster is this module's own (kwok nodes), since it carries what the manifests name and the session's
cluster has not: a running Kueue with a LocalQueue `team-b` (the TrainJob translation is queued), the
priority class `research-high`, Volcano's PodGroup API, nodes labelled `gpu.example.com/class: a100`,
the claims and the Secret the manifests mount. No Volcano scheduler runs here: `volcano_binder` stands in
for it, binding a PodGroup's pods only once all of its `minMember` pods exist, as a gang scheduler does.
Each manifest is first applied as written (a server-side dry run: every admission check, nothing
stored), then with one addition, kwok's `sim.kubetrain.io/hold` pod annotation, so that the simulated
workers keep running instead of finishing after a second.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubetrain_operator import api
from testcluster import kueue
from testcluster.cluster import Cluster, start_cluster
from testcluster.manifests import bare_podgroup_crd
from testcluster.operator_process import OperatorProcess, install_crd
from testcluster.waiting import wait_for

DOCS = Path(__file__).resolve().parents[2] / "docs"
GUIDE = DOCS / "migrating.md"
TRANSLATIONS = sorted((DOCS / "migrating").glob("*.yaml"))
HOLD = {"sim.kubetrain.io/hold": "true"}
A100 = {"gpu.example.com/class": "a100"}
VOLCANO_SCHEDULER = "volcano"


@pytest.mark.unit
def test_the_guide_translates_pytorchjob_and_trainjob_examples() -> None:
    assert {path.stem for path in TRANSLATIONS} >= {
        "pytorchjob-master-workers",
        "pytorchjob-gpu-gang",
        "pytorchjob-elastic",
        "trainjob-torch-distributed",
    }


@pytest.mark.unit
@pytest.mark.parametrize("path", TRANSLATIONS, ids=lambda p: p.name)
def test_the_guide_shows_each_translation_exactly_as_the_file_the_tests_apply(path: Path) -> None:
    guide = GUIDE.read_text()
    assert f"```yaml\n{path.read_text()}```" in guide
    assert f"(migrating/{path.name})" in guide


@pytest.mark.unit
@pytest.mark.parametrize("path", TRANSLATIONS, ids=lambda p: p.name)
def test_each_translation_validates_against_the_models(path: Path) -> None:
    api.TrainingJob.model_validate(yaml.safe_load(path.read_text()))


def _queueing() -> list[dict[str, Any]]:
    """One flavor and a ClusterQueue with room for every translation's requests (cpu, memory, GPUs)."""
    quota = {"cpu": "256", "memory": "2Ti", "nvidia.com/gpu": "64"}
    return [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "any-node"}},
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "migrated"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": list(quota),
                        "flavors": [
                            {
                                "name": "any-node",
                                "resources": [
                                    {"name": name, "nominalQuota": value} for name, value in quota.items()
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "research-high"},
            "value": 1000,
        },
    ]


@pytest.fixture(scope="module")
def migration_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, OperatorProcess]]:
    """A control plane with eight whole-GPU-node kwok nodes (four of them a100), Kueue and Volcano's API,
    then the operator, started last so that it finds both APIs served."""
    running = start_cluster(nodes=0)
    try:
        running.add_nodes(4, prefix="gpu-a100", labels=A100)
        running.add_nodes(4, prefix="gpu")
        install_crd(running)
        running.apply(bare_podgroup_crd("scheduling.volcano.sh", "v1beta1"))
        running.kubectl("wait", "--for=condition=Established", "crd/podgroups.scheduling.volcano.sh")
        with kueue.running_kueue(running, Path(tmp_path_factory.mktemp("kueue"))):
            running.apply(_queueing())
            log = Path(tmp_path_factory.mktemp("operator")) / "operator.log"
            operator = OperatorProcess(
                running, log, extra_args=("--resync-seconds", "2", "--metrics-port", "0")
            )
            operator.start()
            try:
                yield running, operator
            finally:
                operator.stop()
    finally:
        running.stop_and_verify()


def _claims(manifest: dict[str, Any]) -> list[str]:
    return [
        volume["persistentVolumeClaim"]["claimName"]
        for volume in manifest["spec"].get("storage") or ()
        if "persistentVolumeClaim" in volume
    ]


def _secrets(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (ref["name"], ref["key"])
        for entry in manifest["spec"].get("env") or ()
        if (ref := (entry.get("valueFrom") or {}).get("secretKeyRef"))
    ]


def _what_the_manifest_needs(
    namespace: str, manifest: dict[str, Any], directory: Path
) -> list[dict[str, Any]]:
    """The objects a user has before applying the manifest: its claims (bound to host directories, as a
    provisioner would), its Secrets, and the LocalQueue its queue-name label names."""
    objects: list[dict[str, Any]] = []
    for claim in _claims(manifest):
        (directory / claim).mkdir(parents=True, exist_ok=True)
        volume = f"{namespace}-{claim}"
        objects += [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "persistentVolumeReclaimPolicy": "Delete",
                    "hostPath": {"path": str(directory / claim)},
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": volume,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        ]
    for name, key in _secrets(manifest):
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "stringData": {key: "not-a-real-token"},
            }
        )
    queue = manifest["metadata"].get("labels", {}).get("kueue.x-k8s.io/queue-name")
    if queue:
        objects.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": queue, "namespace": namespace},
                "spec": {"clusterQueue": "migrated"},
            }
        )
    return objects


def _get(cluster: Cluster, namespace: str, *args: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("-n", namespace, "get", *args, "-o", "json"))


def _bind_volcano_gangs(cluster: Cluster, namespace: str) -> None:
    """What Volcano's scheduler does for the pods it is named on, reduced to the gang rule: once a
    PodGroup has at least minMember pods, each unbound one is bound to a node of its own."""
    groups = {
        g["metadata"]["name"]: g for g in _get(cluster, namespace, "podgroups.scheduling.volcano.sh")["items"]
    }
    pods = [
        pod
        for pod in _get(cluster, namespace, "pods")["items"]
        if pod["spec"].get("schedulerName") == VOLCANO_SCHEDULER
        and not pod["metadata"].get("deletionTimestamp")
    ]
    for name, group in groups.items():
        members = [
            p
            for p in pods
            if p["metadata"].get("annotations", {}).get("scheduling.k8s.io/group-name") == name
        ]
        if len(members) < group["spec"]["minMember"]:
            continue
        taken = {p["spec"]["nodeName"] for p in members if p["spec"].get("nodeName")}
        free = [n["metadata"]["name"] for n in _get(cluster, "default", "nodes")["items"]]
        free = [node for node in free if node not in taken]
        for pod in (p for p in members if not p["spec"].get("nodeName")):
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": pod["metadata"]["name"], "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": free.pop(0)},
            }
            cluster.kubectl("-n", namespace, "create", "-f", "-", input_text=json.dumps(binding))


@pytest.fixture
def volcano_binder(migration_cluster: tuple[Cluster, OperatorProcess]) -> Iterator[list[str]]:
    """A thread binding the gangs of the namespaces put in the yielded list, until the test ends."""
    cluster, _ = migration_cluster
    namespaces: list[str] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.5):
            for namespace in list(namespaces):
                # A namespace going away mid-pass fails a kubectl call; the next pass retries.
                with contextlib.suppress(Exception):
                    _bind_volcano_gangs(cluster, namespace)

    thread = threading.Thread(target=run, name="volcano-binder", daemon=True)
    thread.start()
    try:
        yield namespaces
    finally:
        stop.set()
        thread.join(timeout=10)


@pytest.mark.cluster
@pytest.mark.parametrize("path", TRANSLATIONS, ids=lambda p: p.name)
def test_each_translation_runs_as_written_under_the_operator(
    path: Path,
    migration_cluster: tuple[Cluster, OperatorProcess],
    volcano_binder: list[str],
    tmp_path: Path,
) -> None:
    """The manifest is accepted by the API server as written and, with what it names in place, the
    operator brings every worker to Running: the job's phase is Running with `workers` ready workers (a
    queued job once Kueue admitted it; a gang once its PodGroup holds every worker). A translation that
    can never start (e.g. `runPolicy.suspend: true` on a queued job, which deactivates its Workload)
    fails here with the job's status in the message."""
    cluster, operator = migration_cluster
    manifest = yaml.safe_load(path.read_text())
    name, workers = manifest["metadata"]["name"], manifest["spec"]["workers"]
    with cluster.temporary_namespace("mig") as namespace:
        cluster.apply(_what_the_manifest_needs(namespace, manifest, tmp_path))
        volcano_binder.append(namespace)
        as_written = cluster.run_kubectl("-n", namespace, "apply", "--dry-run=server", "-f", str(path))
        assert as_written.returncode == 0, f"{path.name}: {as_written.stderr}"
        held = {**manifest, "spec": {**manifest["spec"], "podAnnotations": HOLD}}
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(held))

        def status() -> dict[str, Any]:
            return _get(cluster, namespace, "tj", name).get("status") or {}

        def running_workers() -> int:
            selector = f"kubetrain.io/job-name={name},kubetrain.io/worker-index"
            pods = _get(cluster, namespace, "pods", "-l", selector)["items"]
            return sum(1 for pod in pods if pod["status"].get("phase") == "Running")

        wait_for(
            lambda: status().get("phase") == "Running" and running_workers() == workers,
            f"{name} Running with {workers} running workers",
            timeout=120,
            explain=lambda: (
                f"status: {json.dumps(status(), indent=1)}\n{running_workers()} workers running\n"
                f"operator log:\n{operator.log_tail()}"
            ),
        )
        volcano_binder.remove(namespace)
        if "kueue.x-k8s.io/queue-name" in manifest["metadata"].get("labels", {}):
            (workload,) = _get(cluster, namespace, "workloads.kueue.x-k8s.io")["items"]
            conditions = {c["type"]: c["status"] for c in workload["status"].get("conditions") or ()}
            assert conditions.get("Admitted") == "True", workload["status"]
        if (manifest["spec"].get("gangScheduling") or {}).get("provider") == VOLCANO_SCHEDULER:
            (group,) = _get(cluster, namespace, "podgroups.scheduling.volcano.sh")["items"]
            assert group["spec"]["minMember"] == workers, group
