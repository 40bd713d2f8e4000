"""The chart on the real test control plane: install, upgrade, uninstall, Pod Security and RBAC.

kwok simulates the kubelets, so the operator's pod never runs its image here; what is real is the API
server: CRD registration, PodSecurity admission, the controllers creating pods, and RBAC decisions for
the chart's ServiceAccount (asked with that account's own token).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import (
    CRD_SCANS,
    FORBIDDEN_RESOURCES,
    KUEUE_CLUSTER_NEEDS,
    KUEUE_NEEDS,
    LEADER_NEEDS_BY_NAME,
    NOT_NEEDED,
    OPERATOR_NEEDS,
    REPO_ROOT,
    Chart,
    exec_form,
)
from kubetrain_operator.planning import builders
from kubetrain_trainer import contract, heartbeat, progress
from testcluster import processes, workload
from testcluster.cluster import Cluster
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster

CRD = "trainingjobs.kubetrain.io"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
RELEASE_KINDS = (
    "deployments.apps",
    "serviceaccounts",
    "services",
    "roles.rbac.authorization.k8s.io",
    "rolebindings.rbac.authorization.k8s.io",
    "leases.coordination.k8s.io",
)
REFUSAL = re.compile(r"(?<![,.\d])403\b|Forbidden")
"""An HTTP 403 or a Forbidden error; not the milliseconds of a log timestamp such as `19:55:38,403`."""
CLUSTER_KINDS = (
    "validatingadmissionpolicies.admissionregistration.k8s.io",
    "validatingadmissionpolicybindings.admissionregistration.k8s.io",
    "clusterroles.rbac.authorization.k8s.io",
    "clusterrolebindings.rbac.authorization.k8s.io",
)


def get_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", *args, "-o", "json"))


@pytest.fixture
def chart(cluster: Cluster, helm_bin: Path, tmp_path: Path) -> Chart:
    return Chart(cluster, helm_bin, tmp_path)


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    """A second namespace, for what the operator watches (or must not reach)."""
    with cluster.temporary_namespace("o") as name:
        yield name


@pytest.fixture
def release(chart: Chart, namespace: str) -> Iterator[str]:
    """A release name unique to the test (cluster-scoped names derive from it); uninstalled afterwards."""
    name = f"r{namespace[2:]}"
    try:
        yield name
    finally:
        chart.run("uninstall", name, "--namespace", namespace, check=False)


def fullname(release: str) -> str:
    return f"{release}-kubetrain"


def operator_pods(cluster: Cluster, namespace: str, release: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"
    return get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]


def single_running_operator_pod(cluster: Cluster, namespace: str, release: str) -> list[dict[str, Any]]:
    """The operator pods not being deleted, when there is exactly one and it runs; else an empty list."""
    live = [
        pod
        for pod in operator_pods(cluster, namespace, release)
        if "deletionTimestamp" not in pod["metadata"]
    ]
    return live if len(live) == 1 and live[0]["status"].get("phase") == "Running" else []


def pod_summary(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": pod["metadata"]["name"],
        "created": pod["metadata"]["creationTimestamp"],
        "deleting": pod["metadata"].get("deletionTimestamp"),
        "phase": pod["status"].get("phase"),
        "owner": [owner["name"] for owner in pod["metadata"].get("ownerReferences", [])],
    }


def label_restricted(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl(
        "label", "namespace", namespace, *(f"{k}={v}" for k, v in RESTRICTED.items()), "--overwrite"
    )


def test_install_in_a_restricted_namespace_registers_the_crd_and_the_operator_pod_is_admitted(
    cluster: Cluster, chart: Chart, namespace: str, release: str
) -> None:
    label_restricted(cluster, namespace)
    # Control: the namespace really enforces `restricted`, so the operator pod's admission below means
    # something. A root, privileged pod is refused.
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]},
    }
    with pytest.raises(subprocess.CalledProcessError) as refused:
        cluster.kubectl("create", "--dry-run=server", "-f", "-", input_text=json.dumps(probe))
    assert "PodSecurity" in refused.value.stderr, refused.value.stderr

    output = chart.install(release, namespace, {"watchNamespaces": [namespace]})
    assert "STATUS: deployed" in output
    # NOTES.txt tells the user what was set up and what uninstall keeps.
    assert f"these namespaces only (one Role each): {namespace}" in output
    assert 'ServiceAccount "kubetrain-worker"' in output
    assert "kubectl delete crd trainingjobs.kubetrain.io" in output

    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
    # Served, with its schema. Established says the REST endpoint serves; the OpenAPI document that
    # `kubectl explain` reads is published by another controller a moment later (CI saw explain fail
    # right after Established), so the test waits for it.
    explained = wait_for(
        lambda: cluster.kubectl("explain", "trainingjob.spec.workers", check=False),
        "kubectl explain trainingjob.spec.workers to answer",
        timeout=60,
    )
    assert "FIELD: workers" in explained
    deployment = get_json(cluster, "deployment", fullname(release), "-n", namespace)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == fullname(release)

    # The Deployment settles on exactly one running operator pod. Under load the ReplicaSet controller can
    # create a surplus pod from a stale cache and delete it again (CI saw two), so the test waits for the
    # settled state instead of asserting on the first list it gets.
    pods = wait_for(
        lambda: single_running_operator_pod(cluster, namespace, release),
        "exactly one Running operator pod",
        timeout=120,
        explain=lambda: json.dumps([pod_summary(pod) for pod in operator_pods(cluster, namespace, release)]),
    )
    assert pods[0]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    replica_sets = get_json(
        cluster, "replicasets", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}"
    )
    assert len(replica_sets["items"]) == 1, "installing rolled the Deployment more than once"
    failed = get_json(cluster, "events", "-n", namespace, "--field-selector", "reason=FailedCreate")["items"]
    assert not failed, [event["message"] for event in failed]


def test_upgrade_with_changed_values_rolls_the_deployment_and_swaps_cluster_rbac_for_roles(
    cluster: Cluster, chart: Chart, namespace: str, other_namespace: str, release: str
) -> None:
    chart.install(release, namespace, {})
    before = get_json(cluster, "deployment", fullname(release), "-n", namespace)
    cluster.kubectl("get", "clusterrole", fullname(release))

    values = {
        "watchNamespaces": [other_namespace],
        "image": {
            "operator": {"repository": "ghcr.io/kubetrain/kubetrain-operator", "tag": "0.1.1"},
            "trainer": {"repository": "ghcr.io/kubetrain/kubetrain-trainer", "tag": "0.1.1"},
        },
        "workers": 4,
    }
    assert "STATUS: deployed" in chart.install(release, namespace, values, upgrade=True)

    after = get_json(cluster, "deployment", fullname(release), "-n", namespace)
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    container = after["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/kubetrain/kubetrain-operator:0.1.1"
    assert f"--namespace={other_namespace}" in container["args"]
    assert "--all-namespaces" not in container["args"]
    assert "--workers=4" in container["args"]
    assert "--default-image=ghcr.io/kubetrain/kubetrain-trainer:0.1.1" in container["args"]
    # Narrowing the scope takes the cluster-wide grant away and puts a Role where the operator now works;
    # only the read of Kueue's cluster-scoped objects (kueue.enabled) stays cluster-wide.
    cluster_wide = cluster.kubectl("get", "clusterrole,clusterrolebinding", "--ignore-not-found",
                                   "-l", f"app.kubernetes.io/instance={release}", "-o", "name")  # fmt: skip
    assert sorted(cluster_wide.split()) == [
        f"clusterrole.rbac.authorization.k8s.io/{fullname(release)}-kueue",
        f"clusterrolebinding.rbac.authorization.k8s.io/{fullname(release)}-kueue",
    ]
    role = get_json(cluster, "role", fullname(release), "-n", other_namespace)
    assert role["metadata"]["labels"]["app.kubernetes.io/instance"] == release
    history = yaml.safe_load(chart.run("history", release, "--namespace", namespace, "-o", "yaml"))
    assert [entry["revision"] for entry in history] == [1, 2]


def test_uninstall_leaves_nothing_but_the_crd(
    chart: Chart, namespace: str, other_namespace: str, release: str
) -> None:
    """Everything from templates/ goes, the leader-election Lease included; the CRD from crds/ stays by
    Helm's design (deleting a CRD would delete every TrainingJob), as NOTES.txt says."""
    cluster = chart.cluster
    values = {"watchNamespaces": [other_namespace], "replicas": 2, "leaderElection": {"enabled": True}}
    chart.install(release, namespace, values)
    selector = f"app.kubernetes.io/instance={release}"
    created = cluster.kubectl("get", ",".join(RELEASE_KINDS), "-A", "-l", selector, "-o", "name")
    for kind in (
        "deployment.apps/",
        "serviceaccount/",
        "service/",
        "role.rbac",
        "rolebinding.rbac",
        "lease.coordination",
    ):
        assert kind in created, f"{kind} missing before uninstall:\n{created}"

    chart.uninstall(release, namespace)

    leftovers = cluster.kubectl(
        "get", ",".join(RELEASE_KINDS + CLUSTER_KINDS), "-A", "-l", selector, "-o", "name"
    )
    assert not leftovers.strip(), leftovers
    wait_for(lambda: not operator_pods(cluster, namespace, release), "the operator pod to go away")
    assert not chart.run("list", "--namespace", namespace, "-q").strip()
    cluster.kubectl("get", "crd", CRD)


def write_token_kubeconfig(cluster: Cluster, path: Path, token: str) -> Path:
    """A kubeconfig that authenticates only with `token` (no client certificate to fall back on)."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [
            {"name": "operator", "context": {"cluster": admin["clusters"][0]["name"], "user": "operator"}}
        ],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def service_account_kubeconfig(cluster: Cluster, namespace: str, release: str, directory: Path) -> Path:
    token = cluster.kubectl("create", "token", fullname(release), "-n", namespace, "--duration=30m").strip()
    return write_token_kubeconfig(cluster, directory / "operator.kubeconfig", token)


Check = tuple[str | None, ...]
"""(namespace or None, API group, resource[/subresource], verb[, object name])."""


def can_i(cluster: Cluster, kubeconfig: Path, checks: list[Check]) -> dict[Check, bool]:
    """Ask the API server, as the kubeconfig's user, about each check.

    The same SelfSubjectAccessReview that `kubectl auth can-i` sends, all in one kubectl call.
    """
    reviews = []
    for namespace, group, resource, verb, *name in checks:
        plural, _, subresource = resource.partition("/")
        attributes = {"group": group, "resource": plural, "verb": verb}
        if name:
            attributes["name"] = name[0]
        if subresource:
            attributes["subresource"] = subresource
        if namespace:
            attributes["namespace"] = namespace
        reviews.append({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        })  # fmt: skip
    kubectl = [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig)]
    result = subprocess.run(
        [*kubectl, "create", "-f", "-", "-o", "json"],
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": reviews}),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    # kubectl prints one JSON object per created review, back to back.
    decoder, text, items = json.JSONDecoder(), result.stdout.strip(), []
    while text:
        item, end = decoder.raw_decode(text)
        items.append(item)
        text = text[end:].lstrip()
    assert len(items) == len(checks)
    return {check: item["status"]["allowed"] for check, item in zip(checks, items, strict=True)}


def test_namespaced_install_grants_the_token_exactly_what_the_operator_needs_where_it_works(
    chart: Chart, namespace: str, other_namespace: str, release: str, tmp_path: Path
) -> None:
    cluster = chart.cluster
    values = {"watchNamespaces": [other_namespace], "replicas": 2, "leaderElection": {"enabled": True}}
    chart.install(release, namespace, values)
    kubeconfig = service_account_kubeconfig(cluster, namespace, release, tmp_path)
    # Sanity: the kubeconfig really is the ServiceAccount, not the admin.
    whoami = json.loads(subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout)  # fmt: skip
    assert (
        whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:{fullname(release)}"
    )

    needed: list[Check] = [(other_namespace, *need) for need in (*OPERATOR_NEEDS, *KUEUE_NEEDS)]
    needed += [(namespace, *need, fullname(release)) for need in LEADER_NEEDS_BY_NAME]
    # kueue.enabled (the default): Kueue's ResourceFlavors and priority classes are cluster-scoped.
    needed += [(None, *need) for need in KUEUE_CLUSTER_NEEDS]
    refused = [
        *((other_namespace, "", resource, verb) for resource in FORBIDDEN_RESOURCES if resource != "nodes"
          for verb in ("get", "list", "watch", "create")),
        *((other_namespace, *extra) for extra in NOT_NEEDED),
        # Not watched: its own namespace and any other.
        *((namespace, *need) for need in OPERATOR_NEEDS),
        *(("default", *need) for need in OPERATOR_NEEDS),
        # Nothing else cluster-scoped.
        *((None, *need) for need in CRD_SCANS),
        (None, "", "namespaces", "list"),
        (None, "", "nodes", "list"),
    ]  # fmt: skip
    answers = can_i(cluster, kubeconfig, needed + refused)
    assert [check for check in needed if not answers[check]] == []
    assert [check for check in refused if answers[check]] == []
    # And a real read, not just the review: the API server refuses the token its Secrets.
    secrets = subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "get", "secrets", "-n", other_namespace],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert secrets.returncode != 0 and "Forbidden" in secrets.stderr, secrets.stderr


def test_cluster_wide_install_grants_the_token_the_operator_needs_everywhere_and_no_secrets(
    chart: Chart, namespace: str, other_namespace: str, release: str, tmp_path: Path
) -> None:
    cluster = chart.cluster
    chart.install(release, namespace, {"replicas": 2, "leaderElection": {"enabled": True}})
    kubeconfig = service_account_kubeconfig(cluster, namespace, release, tmp_path)
    everywhere = (namespace, other_namespace, "default")
    needed: list[Check] = [(ns, *need) for ns in everywhere for need in (*OPERATOR_NEEDS, *KUEUE_NEEDS)]
    needed += [(None, *need) for need in KUEUE_CLUSTER_NEEDS]
    # Leader election: its Lease in the release namespace, by name; no other Lease anywhere.
    needed += [(namespace, *need, fullname(release)) for need in LEADER_NEEDS_BY_NAME]
    refused: list[Check] = [
        (ns, "", resource, verb)
        for ns in (*everywhere, None)
        for resource in FORBIDDEN_RESOURCES
        for verb in ("get", "list", "watch")
    ]
    refused += [(other_namespace, *extra) for extra in NOT_NEEDED]
    refused += [(None, "kopf.dev", "clusterkopfpeerings", "patch")]  # no kopf peering
    refused += [(None, *scan) for scan in CRD_SCANS]
    refused += [(namespace, *need, "kube-controller-manager") for need in LEADER_NEEDS_BY_NAME]
    refused += [(other_namespace, *need) for need in LEADER_NEEDS_BY_NAME]
    refused += [(ns, "coordination.k8s.io", "leases", "create") for ns in everywhere]
    answers = can_i(cluster, kubeconfig, needed + refused)
    assert [check for check in needed if not answers[check]] == []
    assert [check for check in refused if answers[check]] == []


def local_ports(args: list[str]) -> list[str]:
    """The pod's arguments with its fixed ports swapped for free local ones (this machine is shared)."""
    swapped = []
    for arg in args:
        if arg.startswith("--liveness="):
            swapped.append(f"--liveness=http://127.0.0.1:{processes.free_port()}/healthz")
        elif arg.startswith("--metrics-port=") and arg != "--metrics-port=0":
            swapped.append(f"--metrics-port={processes.free_port()}")
        else:
            swapped.append(arg)
    return swapped


def start_operator(chart: Chart, namespace: str, release: str, pod_id: str) -> subprocess.Popen[bytes]:
    """`kubetrain operator` exactly as the chart's pod runs it (command, arguments, POD_NAME), on this
    machine: only the ports are local, and the only credential is the chart's ServiceAccount token."""
    cluster = chart.cluster
    container = get_json(cluster, "deployment", fullname(release), "-n", namespace)["spec"]["template"][
        "spec"
    ]["containers"][0]
    command = container.get("command") or exec_form(REPO_ROOT / "Dockerfile.operator", "ENTRYPOINT")
    kubeconfig = service_account_kubeconfig(cluster, namespace, release, chart.directory)
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "POD_NAME": pod_id,
        "POD_NAMESPACE": namespace,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    with (chart.directory / f"{pod_id}.log").open("wb") as log:
        return subprocess.Popen(
            [*command, *local_ports(container["args"])],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )  # fmt: skip


def stop_operator(operator: subprocess.Popen[bytes]) -> None:
    """SIGTERM (kopf shuts down gracefully and a leader releases its Lease), SIGKILL after a grace."""
    processes.stop_group(operator.pid)
    operator.wait(timeout=30)


def liveness(operator: subprocess.Popen[bytes]) -> tuple[int, str]:
    """The status and body its liveness endpoint (the chart's probes' target) answers."""
    argv = [str(arg) for arg in operator.args]
    url = next(arg for arg in argv if arg.startswith("--liveness=")).removeprefix("--liveness=")
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def operator_log(chart: Chart, pod_id: str) -> str:
    return (chart.directory / f"{pod_id}.log").read_text(errors="replace")


def crd_serves_lists(cluster: Cluster) -> bool:
    try:
        cluster.kubectl("get", "trainingjobs", "--all-namespaces")
    except subprocess.CalledProcessError:
        return False
    return True


def submit_job(cluster: Cluster, namespace: str, name: str) -> None:
    cluster.apply({
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        # Gang-scheduled by the cluster's default provider (the Workload API): the token must create
        # the Workload and the PodGroup too.
        "spec": {"workers": 2, "launcher": "plain", "command": ["python", "-c", "print('ok')"],
                 "gangScheduling": {}},
    })  # fmt: skip


def finished_phase(cluster: Cluster, namespace: str, name: str, timeout: float = 120) -> str:
    def phase() -> str | None:
        status = get_json(cluster, "trainingjob", name, "-n", namespace).get("status", {})
        return status.get("phase") if status.get("phase") in ("Succeeded", "Failed") else None

    return wait_for(phase, f"TrainingJob {name} to finish", timeout=timeout)


@pytest.mark.parametrize(
    "mode",
    [
        # kopf retries its refused cluster-wide scans for about a minute before falling back.
        pytest.param("namespaced-with-leader-election", marks=pytest.mark.slow),
        "cluster-wide",
    ],
)
def test_operator_runs_on_the_charts_token_and_finishes_a_job_in_a_restricted_namespace(
    chart: Chart, namespace: str, other_namespace: str, release: str, mode: str
) -> None:
    """The strongest RBAC proof: the real operator, started with the pod's own command (the image's
    ENTRYPOINT unless the chart overrides it) and arguments, authenticated only by the chart's
    ServiceAccount token, reconciles a gang-scheduled TrainingJob to Succeeded. The job's namespace
    enforces `restricted`, so the worker pods the operator builds by default are admitted there.
    Namespaced with leader election is the narrowest grant (Roles only, the Lease by name) with the most
    moving parts; cluster-wide is the ClusterRole, without any namespace permissions."""
    cluster = chart.cluster
    label_restricted(cluster, other_namespace)
    namespaced = mode == "namespaced-with-leader-election"
    values = {"watchNamespaces": [other_namespace], "leaderElection": {"enabled": True}} if namespaced else {}
    chart.install(release, namespace, values)
    pod_id = f"{fullname(release)}-0000000000-local"
    operator = start_operator(chart, namespace, release, pod_id)
    try:
        submit_job(cluster, other_namespace, "rbac-proof")
        final = finished_phase(cluster, other_namespace, "rbac-proof")
        assert operator.poll() is None, "the operator exited"
    except AssertionError:
        print(operator_log(chart, pod_id)[-6000:])  # shown by pytest with the failure
        raise
    finally:
        stop_operator(operator)
    log = operator_log(chart, pod_id)
    assert final == "Succeeded", log[-4000:]
    workers = get_json(cluster, "pods", "-n", other_namespace, "-l", "kubetrain.io/job-name=rbac-proof")[
        "items"
    ]
    assert len(workers) >= 2, "the workers' pods were not admitted"
    for pod in workers:
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "rbac-proof-r0"}
    # Nothing the operator asks is refused: it scans no namespaces or CRDs, in either mode.
    refused = [line for line in log.splitlines() if REFUSAL.search(line)]
    assert refused == [], "\n".join(refused)


def worker_pod(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": {"team": "vision"}},
        "spec": {
            "serviceAccountName": "kubetrain-worker",
            "securityContext": builders.RESTRICTED_POD_SECURITY,
            "containers": [{"name": "worker", "image": "trainer",
                            "securityContext": builders.RESTRICTED_CONTAINER_SECURITY}],
        },
    }  # fmt: skip


def test_worker_token_may_only_set_the_progress_and_heartbeat_annotations_of_its_own_pod(
    chart: Chart, namespace: str, other_namespace: str, release: str
) -> None:
    """The trainer's own PodAnnotator, with a token bound to pod A (as the kubelet mounts it), can set
    A's progress and heartbeat annotations, the only things the operator reads from workers; every other
    change, to A or to its neighbour B, is refused by the chart's admission policy or RBAC."""
    cluster = chart.cluster
    chart.install(release, namespace, {"watchNamespaces": [other_namespace]})
    cluster.apply([worker_pod(other_namespace, "pod-a"), worker_pod(other_namespace, "pod-b")])
    token = cluster.kubectl(
        "create", "token", "kubetrain-worker", "-n", other_namespace,
        "--bound-object-kind=Pod", "--bound-object-name=pod-a", "--duration=30m",
    ).strip()  # fmt: skip
    token_path = chart.directory / "worker-token"
    token_path.write_text(token)
    ca = Path(
        yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["certificate-authority"]
    )
    record = progress.progress_record(epoch=3, epochs=10, step=300, loss=0.42, accuracy=0.8)

    def annotator(pod: str) -> progress.PodAnnotator:
        return progress.PodAnnotator(cluster.server, other_namespace, pod, token_path, ca)

    kubeconfig = write_token_kubeconfig(cluster, chart.directory / "worker.kubeconfig", token)

    def as_worker(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "-n", other_namespace, *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    def patch_as_worker(pod: str, patch: dict[str, Any], dry_run: bool = False) -> tuple[int, str]:
        """A merge patch sent as is with the worker's token, like the trainer's PodAnnotator (`kubectl
        patch` reads the object first, which workers may not do): the HTTP status and the answer."""
        query = "?dryRun=All" if dry_run else ""
        request = urllib.request.Request(
            f"{cluster.server}/api/v1/namespaces/{other_namespace}/pods/{pod}{query}",
            data=json.dumps(patch).encode(),
            method="PATCH",
            headers={"Content-Type": "application/merge-patch+json", "Authorization": f"Bearer {token}"},
        )
        context = ssl.create_default_context(cafile=str(ca))
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def annotation(key: str, value: str) -> dict[str, Any]:
        return {"metadata": {"annotations": {key: value}}}

    # Policies (and RBAC) take effect asynchronously after install: wait with a server-side dry run
    # (admission runs, nothing is stored) until the policy itself refuses a change to the neighbour's pod.
    wait_for(
        lambda: (
            "denied request"
            in patch_as_worker("pod-b", annotation(contract.PROGRESS_ANNOTATION, "{}"), True)[1]
        ),
        "the admission policy to take effect",
    )
    assert annotator("pod-b").patch(record) is False
    assert annotator("pod-a").patch(record) is True
    # The heartbeat as the trainer's thread writes it: set on its own pod, then changed; not the neighbour's.
    tick = heartbeat.ProgressTick(step=300)
    with pytest.raises(urllib.error.HTTPError) as refused_beat:
        heartbeat.Heartbeat(tick, annotator("pod-b"), period=10).beat()
    assert "denied request" in refused_beat.value.read().decode()
    own = heartbeat.Heartbeat(tick, annotator("pod-a"), period=10)
    own.beat()
    tick(301)
    own.beat()
    pod_a = get_json(cluster, "pod", "pod-a", "-n", other_namespace)
    assert json.loads(pod_a["metadata"]["annotations"][contract.PROGRESS_ANNOTATION]) == record
    assert json.loads(pod_a["metadata"]["annotations"][contract.HEARTBEAT_ANNOTATION])["step"] == 301
    pod_b = get_json(cluster, "pod", "pod-b", "-n", other_namespace)
    assert contract.PROGRESS_ANNOTATION not in pod_b["metadata"]["annotations"]
    assert contract.HEARTBEAT_ANNOTATION not in pod_b["metadata"]["annotations"]

    patches = {
        "another annotation": annotation("team", "hijacked"),
        "another annotation beside the heartbeat": {
            "metadata": {"annotations": {contract.HEARTBEAT_ANNOTATION: "{}", "team": "hijacked"}}
        },
        "a label": {"metadata": {"labels": {"kubetrain.io/job-name": "other"}}},
    }
    for what, patch in patches.items():
        status, answer = patch_as_worker("pod-a", patch)
        assert status >= 400 and "denied request" in answer, (what, status, answer)
    refused = {
        "reading its neighbour's pod spec": ("get", "pod", "pod-b", "-o", "yaml"),
        "reading its own pod": ("get", "pod", "pod-a"),
        "listing pods": ("get", "pods"),
        "deleting its pod": ("delete", "pod", "pod-a", "--wait=false"),
        "reading Secrets": ("get", "secrets"),
        "creating pods": ("run", "miner", "--image=miner"),
    }
    for what, args in refused.items():
        result = as_worker(*args)
        assert result.returncode != 0, f"{what} was allowed: {result.stdout}"
        assert "forbidden" in result.stderr.lower() or "denied" in result.stderr.lower(), (
            what,
            result.stderr,
        )
    assert (
        get_json(cluster, "pod", "pod-a", "-n", other_namespace)["metadata"]["annotations"]["team"]
        == "vision"
    )


def test_two_leader_elected_replicas_run_one_at_a_time_and_the_standby_takes_over(
    chart: Chart, namespace: str, other_namespace: str, release: str
) -> None:
    """The recommended HA mode: the second replica stands by without running anything while the first
    holds the chart's Lease, but answers the liveness endpoint the chart probes (so that a rolling update
    goes on), and stops at once on SIGTERM (a rolling update deletes standbys too); when the leader shuts
    down it releases the Lease and the standby leads."""
    cluster = chart.cluster
    chart.install(release, namespace, {"replicas": 2, "leaderElection": {"enabled": True}})
    wait_for(lambda: crd_serves_lists(cluster), "the TrainingJob CRD to serve lists")
    first, second = f"{fullname(release)}-6b7c-aaaaa", f"{fullname(release)}-6b7c-bbbbb"

    def holder() -> str:
        lease = get_json(cluster, "lease", fullname(release), "-n", namespace)
        assert lease["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", "not the chart's Lease"
        return lease["spec"].get("holderIdentity", "")

    operators = {first: start_operator(chart, namespace, release, first)}
    try:
        wait_for(lambda: "leading as" in operator_log(chart, first), "the first replica to lead")
        operators[second] = start_operator(chart, namespace, release, second)
        wait_for(lambda: "standing by" in operator_log(chart, second), "the second replica to stand by")
        assert holder() == first
        assert liveness(operators[second]) == (200, "standing by: campaigning for the Lease\n")
        third = f"{fullname(release)}-6b7c-ccccc"
        operators[third] = start_operator(chart, namespace, release, third)
        wait_for(lambda: "standing by" in operator_log(chart, third), "the third replica to stand by")
        operators[third].send_signal(signal.SIGTERM)
        assert operators.pop(third).wait(timeout=30) == 0, operator_log(chart, third)
        # The chart owns the Lease but sets none of its spec: an upgrade leaves the holder alone.
        chart.install(release, namespace, {"replicas": 2, "leaderElection": {"enabled": True}, "workers": 8},
                      upgrade=True)  # fmt: skip
        assert holder() == first

        submit_job(cluster, other_namespace, "under-first")
        assert finished_phase(cluster, other_namespace, "under-first") == "Succeeded"
        assert "under-first" in operator_log(chart, first)
        assert "under-first" not in operator_log(chart, second)
        assert "kubetrain operator watching" not in operator_log(chart, second), "a standby must run nothing"

        stopped = time.monotonic()
        stop_operator(operators.pop(first))
        wait_for(lambda: "leading as" in operator_log(chart, second), "the standby to take the Lease", 60)
        assert holder() == second
        # Released, not expired: the standby took it without waiting out the 15 s lease.
        assert time.monotonic() - stopped < 15
        submit_job(cluster, other_namespace, "under-second")
        assert finished_phase(cluster, other_namespace, "under-second") == "Succeeded"
        assert "under-second" in operator_log(chart, second)
    finally:
        for operator in operators.values():
            stop_operator(operator)


def test_a_plain_install_shows_live_progress_of_a_job_in_any_namespace(
    chart: Chart, namespace: str, other_namespace: str, release: str
) -> None:
    """`helm install` with no values watches every namespace; a TrainingJob that names no ServiceAccount,
    in a namespace the chart never heard of, still gets EPOCH and TRAIN-LOSS in `kubectl get`: the
    operator (run as the chart's pod runs it, on its token) creates the worker account there, and rank 0's
    bound token may set its own pod's progress annotation, as the trainer does."""
    cluster = chart.cluster
    label_restricted(cluster, other_namespace)
    chart.install(release, namespace, {})
    pod_id = f"{fullname(release)}-0000000000-local"
    operator = start_operator(chart, namespace, release, pod_id)
    try:
        cluster.apply({
            "apiVersion": "kubetrain.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "progress", "namespace": other_namespace},
            "spec": {"workers": 2, "trainer": {"epochs": 10},
                     "podAnnotations": {"sim.kubetrain.io/hold": "true"}},
        })  # fmt: skip

        def master_pod() -> dict[str, Any] | None:
            pods = get_json(cluster, "pods", "-n", other_namespace, "-l", "kubetrain.io/role=master")["items"]
            return pods[0] if pods and pods[0]["status"].get("phase") == "Running" else None

        pod = wait_for(master_pod, "worker 0 to run", timeout=120)
        assert pod["spec"]["serviceAccountName"] == "kubetrain-worker"
        token = cluster.kubectl(
            "create", "token", "kubetrain-worker", "-n", other_namespace, "--bound-object-kind=Pod",
            f"--bound-object-name={pod['metadata']['name']}", "--duration=30m",
        ).strip()  # fmt: skip
        token_path = chart.directory / "worker-token"
        token_path.write_text(token)
        ca = Path(
            yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["certificate-authority"]
        )
        annotator = progress.PodAnnotator(
            cluster.server, other_namespace, pod["metadata"]["name"], token_path, ca
        )
        record = progress.progress_record(epoch=3, epochs=10, step=60, loss=0.4321, accuracy=0.61,
                                          validation_loss=0.5432)  # fmt: skip
        # RBAC for a new RoleBinding takes effect asynchronously.
        wait_for(lambda: annotator.patch(record), "the worker's progress patch to be allowed")

        def columns() -> dict[str, str] | None:
            shown = workload.printed_columns(cluster, "progress", other_namespace)
            return shown if shown.get("EPOCH") == "3" else None

        shown = wait_for(columns, "kubectl get to show the epoch")
        assert operator.poll() is None, "the operator exited"
    except AssertionError:
        print(operator_log(chart, pod_id)[-6000:])
        raise
    finally:
        stop_operator(operator)
    assert (shown["TRAIN-LOSS"], shown["VAL-LOSS"]) == ("0.4321", "0.5432")
    binding = get_json(cluster, "rolebinding", f"{fullname(release)}-worker", "-n", other_namespace)
    assert binding["roleRef"]["name"] == f"{fullname(release)}-worker"
    refused = [line for line in operator_log(chart, pod_id).splitlines() if REFUSAL.search(line)]
    assert refused == []
    # Owned by the chart's worker ClusterRole: uninstalling has the garbage collector remove them.
    chart.uninstall(release, namespace)
    wait_for(
        lambda: not get_json(cluster, "serviceaccounts,rolebindings", "-n", other_namespace,
                             "-l", "app.kubernetes.io/component=worker")["items"],
        "the worker account and its binding to be collected",
    )  # fmt: skip


def hostpath_volume(namespace: str, claim: str, directory: Path) -> dict[str, Any]:
    """What a cluster's storage provisioner would make for `claim` (the test control plane has none)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{namespace}-{claim}"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Delete",
            "hostPath": {"path": str(directory)},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }


QUICKSTART_NOT_RUN = (
    "kubectl exec ",  # the tar into the loader pod: kwok runs no containers
    "kubectl get trainingjobs -w",  # the rest only show what happens, and -w never returns
    "kubectl describe ",
    "kubectl logs ",
)


def readme_quickstart() -> list[str]:
    """The commands of the README's "Quickstart on a cluster" block, in order, without their comments."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("\n## Quickstart on a cluster\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("\n```", 1)[0]
    commands = (line.split("#", 1)[0].strip() for line in block.splitlines())
    return [command for command in commands if command]


def test_the_readme_quickstart_runs_as_written(
    chart: Chart, namespace: str, other_namespace: str, release: str
) -> None:
    """README "Quickstart on a cluster", its commands read from the README and run in order in a namespace
    of the user's (after the example job is first applied without its volumes, where the pending message
    must name the missing claim once): the chart installed with its default values, every kubectl step but
    those in QUICKSTART_NOT_RUN run as written, down to `kubectl wait --for=condition=Succeeded`."""
    install, *steps = readme_quickstart()
    assert install.startswith("helm install kubetrain charts/kubetrain "), install
    assert "--set" not in install and " -f " not in install, (
        f"the test installs the default values: {install}"
    )
    run = [step for step in steps if not step.startswith(QUICKSTART_NOT_RUN)]
    assert len(steps) - len(run) == len(QUICKSTART_NOT_RUN), steps
    assert run[-1].startswith("kubectl wait --for=condition=Succeeded tj/cifar10-cpu "), run
    cluster = chart.cluster
    chart.install(release, namespace, {})
    pod_id = f"{fullname(release)}-0000000000-local"
    operator = start_operator(chart, namespace, release, pod_id)
    example = str(REPO_ROOT / "examples" / "cifar10-cpu.yaml")
    try:
        cluster.kubectl("apply", "-n", other_namespace, "-f", example)

        def pending_message() -> str | None:
            status = get_json(cluster, "trainingjob", "cifar10-cpu", "-n", other_namespace).get("status", {})
            return (
                status.get("pendingMessage")
                if "cifar10-data" in (status.get("pendingMessage") or "")
                else None
            )

        message = wait_for(pending_message, "the job to say why its workers wait")
        # The scheduler says 'persistentvolumeclaim "cifar10-data" not found. not found': said once here.
        assert message.endswith('nodes are available: persistentvolumeclaim "cifar10-data" not found'), (
            message
        )
        cluster.kubectl("delete", "-n", other_namespace, "-f", example, "--wait=true")

        # The claims' volumes, which a default StorageClass would provision.
        cluster.apply([hostpath_volume(other_namespace, claim, chart.directory)
                       for claim in ("cifar10-data", "kubetrain-output")])  # fmt: skip
        for step in run:
            kubectl, *args = shlex.split(step)
            assert kubectl == "kubectl", step
            args = [str(REPO_ROOT / arg) if arg.startswith("examples/") else arg for arg in args]
            cluster.kubectl("-n", other_namespace, *args)
        final = get_json(cluster, "trainingjob", "cifar10-cpu", "-n", other_namespace)["status"]["phase"]
    except AssertionError:
        print(operator_log(chart, pod_id)[-6000:])
        raise
    finally:
        stop_operator(operator)
    assert final == "Succeeded"
    claims = get_json(cluster, "pvc", "-n", other_namespace)["items"]
    assert {c["metadata"]["name"]: c["status"]["phase"] for c in claims} == {
        "cifar10-data": "Bound",
        "kubetrain-output": "Bound",
    }
