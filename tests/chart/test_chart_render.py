"""The chart renders what a platform team can install in a locked-down cluster, and refuses bad values.

Rendering only (`helm lint`, `helm template`): no cluster. What the API server makes of the objects is
tested in test_chart_cluster.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chartkit import (
    CHART_DIR,
    FORBIDDEN_RESOURCES,
    KUEUE_CLUSTER_NEEDS,
    KUEUE_NEEDS,
    LEADER_NEEDS_BY_NAME,
    OPERATOR_NEEDS,
    REPO_ROOT,
    WORKER_IDENTITY_NEEDS,
    WORKER_ROLE_NEEDS_BY_NAME,
    granted,
    helm,
    of_kind,
    only,
    operator_container,
    operator_objects,
    render,
    values_file,
)
from kubetrain_operator import api, cli
from kubetrain_operator.runtime import health

pytestmark = pytest.mark.binaries  # every test renders the chart with helm_bin

NAMESPACED = {"watchNamespaces": ["team-a", "team-b"], "kueue": {"enabled": False}}
LEADER = {"replicas": 2, "leaderElection": {"enabled": True}}
CLUSTER_SCOPED_KINDS = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
VALUE_SETS = {
    "defaults": {},
    "namespaced": NAMESPACED,
    "leader-election": LEADER,
    "leader-election-namespaced": {**NAMESPACED, **LEADER, "logLevel": "debug"},
    "servicemonitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "monitoring": {
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "dashboard": {"enabled": True},
        }
    },
}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_lint_strict_is_clean(helm_bin: Path, tmp_path: Path, values: dict[str, Any]) -> None:
    """--strict turns every lint warning into a failure, so a clean run means no warnings at all."""
    args = ["lint", "--strict", str(CHART_DIR)]
    if values:
        args += ["-f", str(values_file(tmp_path, values))]
    output = helm(helm_bin, *args)
    assert "0 chart(s) failed" in output
    assert "[WARNING]" not in output and "[ERROR]" not in output


def test_default_install_watches_all_namespaces_with_one_cluster_role(helm_bin: Path, tmp_path: Path) -> None:
    objects = render(helm_bin, tmp_path)
    assert not of_kind(objects, "Role") and not of_kind(objects, "RoleBinding")
    role = only(operator_objects(objects, "ClusterRole"), "ClusterRole")
    binding = only(objects, "ClusterRoleBinding")
    account = only(objects, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "kubetrain-system"}
    ]
    assert granted(role["rules"]) == (
        set(OPERATOR_NEEDS)
        | set(WORKER_IDENTITY_NEEDS)
        | set(WORKER_ROLE_NEEDS_BY_NAME)
        | set(KUEUE_NEEDS)
        | set(KUEUE_CLUSTER_NEEDS)
    )
    by_name = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert by_name == [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "resourceNames": ["kt-kubetrain-worker"],
            "verbs": ["get", "bind"],
        }
    ]
    args = operator_container(objects)["args"]
    assert "--all-namespaces" in args
    assert not [arg for arg in args if arg.startswith("--namespace")]


def test_watch_namespaces_get_one_role_each_and_nothing_cluster_scoped(
    helm_bin: Path, tmp_path: Path
) -> None:
    objects = render(helm_bin, tmp_path, NAMESPACED)
    assert not [obj["kind"] for obj in objects if obj["kind"] in CLUSTER_SCOPED_KINDS]
    roles = operator_objects(objects, "Role")
    bindings = operator_objects(objects, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for role in roles:
        assert granted(role["rules"]) == set(OPERATOR_NEEDS)
    account = only(operator_objects(objects, "ServiceAccount"), "ServiceAccount")["metadata"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]
    args = operator_container(objects)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args
    assert "--no-kueue" in args


def test_watch_namespaces_with_kueue_read_kueues_cluster_objects_through_a_cluster_role_of_their_own(
    helm_bin: Path, tmp_path: Path
) -> None:
    objects = render(helm_bin, tmp_path, {**NAMESPACED, "kueue": {"enabled": True}})
    for role in operator_objects(objects, "Role"):
        assert granted(role["rules"]) == set(OPERATOR_NEEDS) | set(KUEUE_NEEDS)
    assert granted(only(objects, "ClusterRole")["rules"]) == set(KUEUE_CLUSTER_NEEDS)
    assert only(objects, "ClusterRoleBinding")["roleRef"]["name"].endswith("-kueue")
    assert "--no-kueue" not in operator_container(objects)["args"]


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_no_rule_reaches_secrets_or_uses_wildcards_or_escalation(
    helm_bin: Path, tmp_path: Path, values: dict[str, Any]
) -> None:
    """The one exception, watching all namespaces: creating the workers' account and RoleBinding where
    they run, binding only the workers' ClusterRole (pinned by name, so nothing else can be bound that
    grants more than the operator holds)."""
    objects = render(helm_bin, tmp_path, values)
    rules = [rule for obj in objects if obj["kind"] in {"Role", "ClusterRole"} for rule in obj["rules"]]
    assert rules, "no RBAC rules rendered"
    for group, resource, verb in granted(rules) - set(WORKER_IDENTITY_NEEDS) - set(WORKER_ROLE_NEEDS_BY_NAME):
        assert "*" not in (group, resource, verb), (group, resource, verb)
        assert resource.split("/")[0] not in FORBIDDEN_RESOURCES, (group, resource, verb)
        assert verb not in {"escalate", "bind", "impersonate", "deletecollection"}, (group, resource, verb)
    assert not [rule for rule in rules if "nonResourceURLs" in rule]
    # resourceNames pins the leader-election Lease and the workers' ClusterRole; the latter always.
    assert all(
        rule["resources"] in (["leases"], ["clusterroles"]) for rule in rules if "resourceNames" in rule
    )
    assert all("resourceNames" in rule for rule in rules if "clusterroles" in rule["resources"])


def test_one_replica_without_election_is_replaced_not_rolled_and_ships_only_the_trainingjob_crd(
    helm_bin: Path, tmp_path: Path
) -> None:
    """Recreate: the old operator stops before the new one starts, as nothing else arbitrates."""
    objects = render(helm_bin, tmp_path, include_crds=True)
    crds = [o["metadata"]["name"] for o in of_kind(objects, "CustomResourceDefinition")]
    assert crds == ["trainingjobs.kubetrain.io"]
    assert "--leader-elect" not in operator_container(objects)["args"]
    assert "command" not in operator_container(objects), "the image's own entrypoint runs"
    assert only(objects, "Deployment")["spec"]["strategy"]["type"] == "Recreate"
    assert not of_kind(objects, "Lease")


def test_operator_pod_meets_the_restricted_pod_security_standard(helm_bin: Path, tmp_path: Path) -> None:
    objects = render(helm_bin, tmp_path)
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])


def test_liveness_probe_targets_the_port_kopf_serves_liveness_on(helm_bin: Path, tmp_path: Path) -> None:
    objects = render(helm_bin, tmp_path, {"liveness": {"port": 8181}})
    container = operator_container(objects)
    assert "--liveness=http://0.0.0.0:8181/healthz" in container["args"]
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == "/healthz"
    assert ports[probe["port"]] == 8181


def test_metrics_service_selects_the_operator_pod_and_its_metrics_port(
    helm_bin: Path, tmp_path: Path
) -> None:
    objects = render(
        helm_bin,
        tmp_path,
        {
            "metrics": {
                "enabled": True,
                "port": 9300,
                "service": {"type": "ClusterIP", "port": 9301},
                "serviceMonitor": {"enabled": False},
            }
        },
    )
    service = only(objects, "Service")
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9301, "targetPort": "metrics", "protocol": "TCP"}
    ]
    container = operator_container(objects)
    assert {"name": "metrics", "containerPort": 9300, "protocol": "TCP"} in container["ports"]
    assert "--metrics-port=9300" in container["args"]
    assert not of_kind(objects, "ServiceMonitor")


def test_service_monitor_is_optional_and_scrapes_the_metrics_service(helm_bin: Path, tmp_path: Path) -> None:
    objects = render(helm_bin, tmp_path, VALUE_SETS["servicemonitor"])
    monitor = only(objects, "ServiceMonitor")
    service = only(objects, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    # the per-job series' `namespace` is the TrainingJob's, not renamed for the operator pod's namespace
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kubetrain-system"]}


def test_disabling_metrics_removes_the_service_and_port_and_turns_the_endpoint_off(
    helm_bin: Path, tmp_path: Path
) -> None:
    """The operator serves metrics on 8080 unless told `--metrics-port=0`, so "off" must say so."""
    objects = render(
        helm_bin,
        tmp_path,
        {
            "metrics": {
                "enabled": False,
                "port": 9090,
                "service": {"type": "ClusterIP", "port": 9090},
                "serviceMonitor": {"enabled": True},
            }
        },
    )
    assert not of_kind(objects, "Service") and not of_kind(objects, "ServiceMonitor")
    container = operator_container(objects)
    assert [a for a in container["args"] if a.startswith("--metrics-port")] == ["--metrics-port=0"]
    assert "metrics" not in {p["name"] for p in container["ports"]}


def test_images_are_pinned_and_the_trainer_image_is_the_operator_default(
    helm_bin: Path, tmp_path: Path
) -> None:
    container = operator_container(render(helm_bin, tmp_path))
    assert container["image"].startswith("ghcr.io/kubetrain/kubetrain-operator:")
    assert not container["image"].endswith(":latest")
    default_image = [a for a in container["args"] if a.startswith("--default-image=")]
    assert default_image == [f"--default-image={api.constants.TRAINER_IMAGE}"]

    digest = "sha256:" + "a" * 64
    pinned = operator_container(
        render(
            helm_bin,
            tmp_path,
            {
                "image": {
                    "operator": {"repository": "registry.example/op", "tag": "1.2.3", "digest": digest},
                    "trainer": {"repository": "registry.example/tr", "tag": "1.2.3"},
                }
            },
        )
    )
    assert pinned["image"] == f"registry.example/op@{digest}"
    assert "--default-image=registry.example/tr:1.2.3" in pinned["args"]


def test_operator_settings_and_scheduling_values_reach_the_pod(helm_bin: Path, tmp_path: Path) -> None:
    objects = render(
        helm_bin,
        tmp_path,
        {
            "logLevel": "debug",
            "logFormat": "json",
            "workers": 4,
            "nodeSelector": {"pool": "system"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}
                        ]
                    }
                }
            },
        },
    )
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert "nodeAffinity" in pod["affinity"]
    args = operator_container(objects)["args"]
    assert "--workers=4" in args and "--verbose" in args
    assert "--log-format=json" in args
    default_args = operator_container(render(helm_bin, tmp_path))["args"]
    assert "--verbose" not in default_args and "--log-format=full" in default_args


BAD_VALUES = {
    "unknown top-level key": ({"watchNamespace": ["a"]}, "watchNamespace"),
    "unknown nested key": (
        {
            "metrics": {
                "enabled": True,
                "port": 1,
                "service": {"type": "ClusterIP", "port": 1},
                "serviceMonitor": {"enabled": False},
                "prot": 2,
            }
        },
        "prot",
    ),
    "zero workers": ({"workers": 0}, "/workers"),
    "bad log level": ({"logLevel": "trace"}, "/logLevel"),
    "bad log format": ({"logFormat": "xml"}, "/logFormat"),
    "invalid namespace name": ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    "privilege escalation": (
        {
            "securityContext": {
                "allowPrivilegeEscalation": True,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }
        },
        "/securityContext/allowPrivilegeEscalation",
    ),
    "writable root": (
        {
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": False,
                "capabilities": {"drop": ["ALL"]},
            }
        },
        "/securityContext/readOnlyRootFilesystem",
    ),
    "bad digest": (
        {
            "image": {
                "operator": {"repository": "r/op", "tag": "1", "digest": "md5:00"},
                "trainer": {"repository": "r/tr", "tag": "1"},
            }
        },
        "/image/operator/digest",
    ),
    "replicas as string": ({"replicas": "2"}, "/replicas"),
    "bad port": ({"liveness": {"port": 70000}}, "/liveness/port"),
    "kopf peering, no longer an HA mode": ({"peering": {"enabled": True}}, "peering"),
    "unknown volume type": ({"trainingJobPolicy": {"allowedVolumeTypes": ["nfs"]}}, "/trainingJobPolicy"),
    "lease name that is no DNS name": (
        {"leaderElection": {"enabled": True, "leaseName": "Lease_1"}},
        "/leaderElection/leaseName",
    ),
    "tag of the wrong type": (
        {
            "image": {
                "operator": {"repository": "r/op", "tag": True},
                "trainer": {"repository": "r/tr", "tag": "1"},
            }
        },
        "/image/operator/tag",
    ),
}


@pytest.mark.parametrize(("values", "field"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_schema_refuses_bad_values_naming_the_field(
    helm_bin: Path, tmp_path: Path, values: dict[str, Any], field: str
) -> None:
    args = ["template", "kt", str(CHART_DIR), "-f", str(values_file(tmp_path, values))]
    output = helm(helm_bin, *args, check=False)
    assert "values don't meet the specifications of the schema" in output, output
    assert field in output, output
    # Each refusal says what is wrong with the value, never only that a combinator failed.
    assert "' failed" not in output, output


def test_training_job_policy_values_become_the_operators_flags(helm_bin: Path, tmp_path: Path) -> None:
    def parsed(values: dict[str, Any]) -> Any:
        return cli._parser().parse_args(
            ["operator", *operator_container(render(helm_bin, tmp_path, values))["args"]]
        )

    narrow = parsed(
        {"trainingJobPolicy": {"allowedVolumeTypes": ["persistentVolumeClaim", "emptyDir"],
                               "allowedServiceAccounts": ["kubetrain-worker"]}}
    )  # fmt: skip
    assert narrow.allowed_volume_types == ["persistentVolumeClaim", "emptyDir"]
    assert narrow.allowed_service_accounts == ["kubetrain-worker"]
    nothing = parsed({"trainingJobPolicy": {"allowedVolumeTypes": [], "allowedServiceAccounts": []}})
    assert (nothing.allowed_volume_types, nothing.allowed_service_accounts) == ([], [])
    default = operator_container(render(helm_bin, tmp_path))["args"]
    assert not [arg for arg in default if arg.startswith("--allowed-")]  # everything the API allows


def test_a_latest_tag_is_refused_saying_what_to_pin(helm_bin: Path, tmp_path: Path) -> None:
    values = {
        "image": {
            "operator": {"repository": "r/op", "tag": "1"},
            "trainer": {"repository": "r/tr", "tag": "latest"},
        }
    }
    output = helm(
        helm_bin, "template", "kt", str(CHART_DIR), "-f", str(values_file(tmp_path, values)), check=False
    )
    assert "image.trainer.tag: latest is refused: pin a version" in output, output


def test_several_replicas_without_an_ha_mode_are_refused(helm_bin: Path, tmp_path: Path) -> None:
    """Without leader election every replica would reconcile every job."""
    output = helm(
        helm_bin,
        "template",
        "kt",
        str(CHART_DIR),
        "-f",
        str(values_file(tmp_path, {"replicas": 2})),
        check=False,
    )
    assert "replicas > 1 needs leaderElection.enabled=true" in output


def test_leader_election_gets_a_lease_role_by_name(helm_bin: Path, tmp_path: Path) -> None:
    objects = render(helm_bin, tmp_path, {**NAMESPACED, **LEADER})
    lease_roles = [
        r for r in operator_objects(objects, "Role") if r["metadata"]["name"].endswith("-leader-election")
    ]
    assert len(lease_roles) == 1
    role = lease_roles[0]
    assert role["metadata"]["namespace"] == "kubetrain-system"
    assert granted(role["rules"]) == set(LEADER_NEEDS_BY_NAME)
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["kt-kubetrain"],
                      "verbs": ["get", "update"]}]  # fmt: skip
    container = operator_container(objects)
    assert {"--leader-elect", "--leader-election-namespace=kubetrain-system",
            "--leader-election-id=kt-kubetrain"} <= set(container["args"])  # fmt: skip
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert only(objects, "Deployment")["spec"]["replicas"] == 2
    assert "command" not in container, "the image's own entrypoint runs"
    lease = only(objects, "Lease")
    assert lease["metadata"] == {**lease["metadata"], "name": "kt-kubetrain", "namespace": "kubetrain-system"}
    assert lease["spec"] == {}, "the operator owns every spec field"


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_with_leader_election_a_rollout_replaces_one_pod_at_a_time_once_a_standby_is_ready(
    helm_bin: Path, tmp_path: Path, replicas: int
) -> None:
    """What lets `helm upgrade --wait` finish (tests/e2e/test_real_node_rollout.py runs one with 2): a new
    pod starts before an old one stops, and is Ready once it answers the address the operator serves its
    liveness on, which a standby answers while it campaigns (runtime/health.py). No probe waits for the
    pod to lead: helm waits for every new pod to be Ready, and only one of them leads."""
    objects = render(helm_bin, tmp_path, {"replicas": replicas, "leaderElection": {"enabled": True}})
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == replicas
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    container = operator_container(objects)
    assert "startupProbe" not in container
    liveness = next(arg for arg in container["args"] if arg.startswith("--liveness="))
    _, port, path = health.address(liveness.removeprefix("--liveness="))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert ports[probe["httpGet"]["port"]] == port and probe["httpGet"]["path"] == path


def test_gang_scheduler_grants_follow_the_values(helm_bin: Path, tmp_path: Path) -> None:
    def group_grants(values: dict[str, Any]) -> set[tuple[str, str]]:
        role = only(operator_objects(render(helm_bin, tmp_path, values), "ClusterRole"), "ClusterRole")
        grants = granted(role["rules"])
        return {
            (group, resource)
            for group, resource, _ in grants
            if resource in ("podgroups", "workloads") and group != "kueue.x-k8s.io"
        }

    assert group_grants({}) == {
        ("scheduling.k8s.io", "workloads"),
        ("scheduling.k8s.io", "podgroups"),
        ("scheduling.volcano.sh", "podgroups"),
        ("scheduling.x-k8s.io", "podgroups"),
    }
    assert group_grants({"gangSchedulers": ["volcano"]}) == {("scheduling.volcano.sh", "podgroups")}
    assert group_grants({"gangSchedulers": ["kubernetes"]}) == {
        ("scheduling.k8s.io", "workloads"),
        ("scheduling.k8s.io", "podgroups"),
    }
    assert group_grants({"gangSchedulers": []}) == set()


def test_every_object_carries_the_release_labels(helm_bin: Path, tmp_path: Path) -> None:
    """`kubectl get ... -l app.kubernetes.io/instance=<release>` must find everything the chart made."""
    for values in VALUE_SETS.values():
        for obj in render(helm_bin, tmp_path, values):
            labels = obj["metadata"].get("labels", {})
            assert labels.get("app.kubernetes.io/instance") == "kt", obj["kind"]
            assert labels.get("app.kubernetes.io/managed-by") == "Helm", obj["kind"]


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_operator_cli_accepts_the_rendered_arguments(
    helm_bin: Path, tmp_path: Path, values: dict[str, Any]
) -> None:
    """Every flag the chart passes exists in `kubetrain operator` and means what the chart intends.

    An unknown flag would crash-loop the pod with an argparse error that no render test would notice.
    """
    objects = render(helm_bin, tmp_path, values)
    container = operator_container(objects)
    args = ["operator", *container["args"]]
    parsed = cli._parser().parse_args(args)
    namespaces = values.get("watchNamespaces", [])
    assert parsed.all_namespaces is (not namespaces)
    assert (parsed.namespaces or []) == namespaces
    assert parsed.default_image == api.constants.TRAINER_IMAGE
    assert parsed.liveness == "http://0.0.0.0:8081/healthz"
    assert parsed.metrics_port == 8080
    assert parsed.leader_elect is bool(values.get("leaderElection", {}).get("enabled"))
    assert parsed.verbose is (values.get("logLevel") == "debug")
    assert parsed.log_format == values.get("logFormat", "full")


def test_chart_crd_is_the_generated_one(helm_bin: Path, tmp_path: Path) -> None:
    """The chart installs the CRD `kubetrain crds` generates into crds/, byte for byte (never hand-edited)."""
    chart_crd = CHART_DIR / "crds" / "kubetrain.io_trainingjobs.yaml"
    assert chart_crd.read_text() == (REPO_ROOT / "crds" / "kubetrain.io_trainingjobs.yaml").read_text()
    crds = of_kind(render(helm_bin, tmp_path, include_crds=True), "CustomResourceDefinition")
    assert [crd["metadata"]["name"] for crd in crds] == ["trainingjobs.kubetrain.io"]


def test_workers_get_a_service_account_in_each_watched_namespace_that_can_only_patch_pods(
    helm_bin: Path, tmp_path: Path
) -> None:
    """Rank 0 patches its own pod's progress annotation; RBAC can say no more narrowly than pods/patch,
    and grants nothing else (the trainer never reads a pod: `get` would show workers every pod spec of
    the namespace, env values included)."""
    objects = render(helm_bin, tmp_path, NAMESPACED)
    workers = [o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in workers:
        by_kind.setdefault(obj["kind"], []).append(obj)
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        assert sorted(o["metadata"]["namespace"] for o in by_kind[kind]) == ["team-a", "team-b"], kind
    for role in by_kind["Role"]:
        assert granted(role["rules"]) == {("", "pods", "patch")}
    for binding in by_kind["RoleBinding"]:
        namespace = binding["metadata"]["namespace"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "kubetrain-worker", "namespace": namespace}
        ]
    policy = only(workers, "ValidatingAdmissionPolicy")
    assert only(workers, "ValidatingAdmissionPolicyBinding")["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    condition = " ".join(policy["spec"]["matchConditions"][0]["expression"].split())
    assert condition == (
        "request.userInfo.username.startsWith('system:serviceaccount:') && "
        "request.userInfo.username.endsWith(':kubetrain-worker')"
    )


def test_watching_all_namespaces_the_operator_is_given_the_workers_cluster_role_to_bind_where_they_run(
    helm_bin: Path, tmp_path: Path
) -> None:
    """The chart cannot know where workers will run: it creates a ClusterRole that grants only pods/patch
    and binds it nowhere; the operator creates the account and a RoleBinding of that role where it
    creates workers (workeridentity). With the worker account off, neither the role nor the flags."""
    objects = render(helm_bin, tmp_path)
    role = only([o for o in of_kind(objects, "ClusterRole") if o not in operator_objects(objects, "ClusterRole")],
                "ClusterRole")  # fmt: skip
    assert role["metadata"]["name"] == "kt-kubetrain-worker"
    assert granted(role["rules"]) == {("", "pods", "patch")}
    args = operator_container(objects)["args"]
    assert "--worker-service-account=kubetrain-worker" in args
    assert "--worker-cluster-role=kt-kubetrain-worker" in args
    assert only(objects, "ValidatingAdmissionPolicy")

    off = render(
        helm_bin, tmp_path, {"workerServiceAccount": {"create": False, "name": "x", "namespaces": []}}
    )
    assert [o["metadata"]["name"] for o in of_kind(off, "ClusterRole")] == ["kt-kubetrain"]
    assert granted(only(off, "ClusterRole")["rules"]) == (
        set(OPERATOR_NEEDS) | set(KUEUE_NEEDS) | set(KUEUE_CLUSTER_NEEDS)
    )
    assert not [arg for arg in operator_container(off)["args"] if arg.startswith("--worker-")]


def test_worker_service_account_follows_its_values(helm_bin: Path, tmp_path: Path) -> None:
    def worker_namespaces(values: dict[str, Any]) -> list[str]:
        objects = render(helm_bin, tmp_path, values)
        accounts = [
            o for o in of_kind(objects, "ServiceAccount") if o["metadata"]["name"] == "kubetrain-worker"
        ]
        return sorted(o["metadata"]["namespace"] for o in accounts)

    assert worker_namespaces({}) == [], "watching all namespaces, the operator creates it where workers run"
    assert worker_namespaces({"workerServiceAccount": {"create": True, "name": "kubetrain-worker",
                                                       "namespaces": ["ml"]}}) == ["ml"]  # fmt: skip
    assert worker_namespaces({**NAMESPACED, "workerServiceAccount": {"create": True, "name": "kubetrain-worker",
                                                                     "namespaces": ["team-a", "ml"]}}) == [
        "ml", "team-a", "team-b"]  # fmt: skip
    assert worker_namespaces({**NAMESPACED, "workerServiceAccount": {"create": False, "name": "kubetrain-worker",
                                                                     "namespaces": []}}) == []  # fmt: skip


def test_the_operator_pod_gets_no_service_link_env(helm_bin: Path, tmp_path: Path) -> None:
    """Service links would put KUBETRAIN_METRICS_PORT=tcp://<ip>:8080 (the chart's own metrics Service)
    into the operator's env, where the operator reads its metrics port: it crashed on a real node."""
    deployment = only(render(helm_bin, tmp_path), "Deployment")
    assert deployment["spec"]["template"]["spec"]["enableServiceLinks"] is False
