"""Child manifests: Service, worker Jobs, pod template, env contract, volumes, resources, ownership."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from kubetrain_operator.api import constants
from kubetrain_operator.planning import builders
from kubetrain_trainer.config import TrainerConfig
from operator_fakes import NS, UID, command_spec, context, trainer_spec

pytestmark = pytest.mark.unit


def _env(job: dict[str, Any]) -> dict[str, Any]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _container(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("workers", "nproc", "resources"),
    [
        (1, 1, None),
        (3, 1, None),
        (2, 4, None),
        (4, "auto", {"limits": {"nvidia.com/gpu": 8}}),
        (2, "auto", None),
    ],
)
def test_env_contract_for_every_rank(workers: int, nproc: int | str, resources: Any) -> None:
    spec = trainer_spec(workers=workers, nprocPerWorker=nproc)
    if resources:
        spec["resources"] = resources
    ctx = context(spec=spec, attempt=3)
    per_worker = ctx.spec.procs_per_worker()
    expected_nproc = 8 if resources else (1 if nproc == "auto" else nproc)
    assert per_worker == expected_nproc
    master = f"demo-r3-w0.demo.{NS}.svc"
    for index in range(workers):
        env = _env(builders.build_worker_job(ctx, index))
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == master
        assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29500"
        assert env["WORLD_SIZE"] == str(workers * expected_nproc)  # processes, never nodes
        assert env["RANK"] == str(index * expected_nproc)
        assert env["NODE_RANK"] == env["PET_NODE_RANK"] == str(index)
        assert env["PET_NNODES"] == str(workers)
        assert env["PET_NPROC_PER_NODE"] == env["LOCAL_WORLD_SIZE"] == str(expected_nproc)
        assert ("LOCAL_RANK" in env) == (expected_nproc == 1)
        assert env["KUBETRAIN_JOB_NAME"] == "demo"
        assert env["KUBETRAIN_RESTART_ATTEMPT"] == "3"
        assert env["KUBETRAIN_JOB_UID"] == UID  # checkpoints resume this TrainingJob only
        container = builders.build_worker_job(ctx, index)["spec"]["template"]["spec"]["containers"][0]
        assert env["KUBETRAIN_TERMINATION_LOG"] == container["terminationMessagePath"]
        assert env["KUBETRAIN_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["KUBETRAIN_POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_trainer_config_travels_as_json_the_trainer_accepts() -> None:
    ctx = context(
        spec=trainer_spec(trainer={"epochs": 7, "model": "resnet_small", "data": {"dataset": "fake"}})
    )
    raw = _env(builders.build_worker_job(ctx, 0))["KUBETRAIN_TRAINER_CONFIG"]
    config = TrainerConfig.model_validate(json.loads(raw))
    assert config.epochs == 7
    assert config.model == "resnet_small"
    assert config.data.dataset == "fake"


def test_custom_command_gets_no_trainer_config() -> None:
    env = _env(builders.build_worker_job(context(spec=command_spec()), 0))
    assert "KUBETRAIN_TRAINER_CONFIG" not in env


@pytest.mark.parametrize(
    ("spec", "command", "args"),
    [
        (trainer_spec(nprocPerWorker=1), ["kubetrain", "train"], None),
        (trainer_spec(nprocPerWorker=2), ["torchrun", "--no-python", "kubetrain", "train"], None),
        (
            command_spec(args=["--lr", "0.1"]),
            ["torchrun", "--no-python", "python", "/app/train.py"],
            ["--lr", "0.1"],
        ),
        (command_spec(launcher="plain"), ["python", "/app/train.py"], None),
        (command_spec(launcher="plain", args=["-v"]), ["python", "/app/train.py"], ["-v"]),
    ],
)
def test_command_for_trainer_and_custom_scripts(spec: dict[str, Any], command: list[str], args: Any) -> None:
    container = _container(builders.build_worker_job(context(spec=spec), 0))
    assert container["command"] == command
    assert container.get("args") == args


def test_user_env_comes_after_the_contract_so_it_can_refer_to_it() -> None:
    spec = trainer_spec(env=[{"name": "CKPT", "value": "/out/$(KUBETRAIN_JOB_NAME)"}])
    env = _container(builders.build_worker_job(context(spec=spec), 0))["env"]
    assert env[-1] == {"name": "CKPT", "value": "/out/$(KUBETRAIN_JOB_NAME)"}
    assert [e["name"] for e in env].index("KUBETRAIN_JOB_NAME") < len(env) - 1


def test_worker_job_runs_one_pod_and_never_retries_it() -> None:
    job = builders.build_worker_job(context(attempt=1), 1)
    assert job["metadata"]["name"] == "demo-r1-w1"
    assert job["metadata"]["namespace"] == NS
    assert job["spec"]["completions"] == 1
    assert job["spec"]["parallelism"] == 1
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["hostname"] == "demo-r1-w1"
    assert pod["subdomain"] == "demo"


@pytest.mark.parametrize(("index", "role"), [(0, "master"), (1, "worker"), (5, "worker")])
def test_labels_name_job_worker_attempt_and_role(index: int, role: str) -> None:
    ctx = context(spec=trainer_spec(workers=6, podLabels={"team": "vision"}), attempt=2)
    job = builders.build_worker_job(ctx, index)
    expected = {
        constants.LABEL_JOB_NAME: "demo",
        constants.LABEL_WORKER_INDEX: str(index),
        constants.LABEL_RESTART_ATTEMPT: "2",
        constants.LABEL_ROLE: role,
    }
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert expected.items() <= labels.items()
    assert job["spec"]["template"]["metadata"]["labels"]["team"] == "vision"


def test_every_child_is_controlled_by_the_trainingjob() -> None:
    ctx = context()
    expected = {
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "name": "demo",
        "uid": UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for child in [builders.build_service(ctx), *builders.build_worker_jobs(ctx)]:
        assert child["metadata"]["ownerReferences"] == [expected]


def test_service_is_headless_and_publishes_unready_workers() -> None:
    svc = builders.build_service(context(spec=trainer_spec(masterPort=23456)))
    assert svc["metadata"]["name"] == "demo"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {constants.LABEL_JOB_NAME: "demo"}
    assert svc["spec"]["ports"][0]["port"] == 23456


def test_long_trainingjob_names_still_select_their_pods() -> None:
    name = "a" * 100
    ctx = context(name=name)
    svc = builders.build_service(ctx)
    pod_labels = builders.build_worker_job(ctx, 0)["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert len(pod_labels[constants.LABEL_JOB_NAME]) <= 63


@pytest.mark.parametrize(
    ("storage", "volume", "mount"),
    [
        (
            {
                "name": "data",
                "mountPath": "/data",
                "persistentVolumeClaim": {"claimName": "cifar", "readOnly": True},
            },
            {"name": "data-data", "persistentVolumeClaim": {"claimName": "cifar", "readOnly": True}},
            {"name": "data-data", "mountPath": "/data", "readOnly": True},
        ),
        (
            {
                "name": "out",
                "mountPath": "/output",
                "subPath": "runs",
                "persistentVolumeClaim": {"claimName": "o"},
            },
            {"name": "data-out", "persistentVolumeClaim": {"claimName": "o"}},
            {"name": "data-out", "mountPath": "/output", "subPath": "runs"},
        ),
        (
            {"name": "host", "mountPath": "/data", "hostPath": {"path": "/srv/data"}},
            {"name": "data-host", "hostPath": {"path": "/srv/data", "type": "DirectoryOrCreate"}},
            {"name": "data-host", "mountPath": "/data"},
        ),
        (
            {"name": "scratch", "mountPath": "/tmp/x", "emptyDir": {"sizeLimit": "10Gi"}},
            {"name": "data-scratch", "emptyDir": {"sizeLimit": "10Gi"}},
            {"name": "data-scratch", "mountPath": "/tmp/x"},
        ),
    ],
)
def test_storage_becomes_pod_volumes_and_mounts(storage: Any, volume: Any, mount: Any) -> None:
    job = builders.build_worker_job(context(spec=trainer_spec(storage=[storage])), 0)
    pod = job["spec"]["template"]["spec"]
    assert volume in pod["volumes"]
    assert mount in pod["containers"][0]["volumeMounts"]
    # /dev/shm is always memory-backed: the 64 MiB container default breaks DataLoader workers.
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (None, None),
        ({"requests": {"cpu": 2, "memory": "8Gi"}}, {"requests": {"cpu": "2", "memory": "8Gi"}}),
        (
            {"requests": {"cpu": "500m", "nvidia.com/gpu": 1}},
            {"requests": {"cpu": "500m", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
        ),
        (
            {"limits": {"nvidia.com/gpu": 2, "memory": "16Gi"}},
            {"limits": {"nvidia.com/gpu": "2", "memory": "16Gi"}},
        ),
    ],
)
def test_resources_per_worker(resources: Any, expected: Any) -> None:
    spec = trainer_spec(resources=resources) if resources else trainer_spec()
    assert _container(builders.build_worker_job(context(spec=spec), 0)).get("resources") == expected


def test_pods_pass_the_restricted_pod_security_standard() -> None:
    pod = builders.build_worker_job(context(), 0)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert not sc.get("privileged")


def test_scheduling_fields_and_image_defaults() -> None:
    spec = trainer_spec(
        nodeSelector={"pool": "gpu"},
        tolerations=[{"key": "gpu", "operator": "Exists"}],
        affinity={"nodeAffinity": {}},
        priorityClassName="high",
        schedulerName="volcano",
        serviceAccountName="trainer",
        podAnnotations={"x/y": "z"},
        imagePullSecrets=[{"name": "registry"}],
    )
    job = builders.build_worker_job(context(spec=spec), 0)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert pod["priorityClassName"] == "high"
    assert pod["schedulerName"] == "volcano"
    assert pod["serviceAccountName"] == "trainer"
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert job["spec"]["template"]["metadata"]["annotations"]["x/y"] == "z"
    assert pod["containers"][0]["image"] == "registry.local/kubetrain:test"
    custom = builders.build_worker_job(
        context(spec=trainer_spec(image="me/img:1", imagePullPolicy="Never")), 0
    )
    assert _container(custom)["image"] == "me/img:1"
    assert _container(custom)["imagePullPolicy"] == "Never"


@pytest.mark.parametrize(
    ("gang", "api_version", "spec", "scheduler"),
    [
        (
            {"provider": "volcano", "queue": "research"},
            "scheduling.volcano.sh/v1beta1",
            {"minMember": 3, "queue": "research"},
            "volcano",
        ),
        (
            {"provider": "scheduler-plugins", "scheduleTimeoutSeconds": 60},
            "scheduling.x-k8s.io/v1alpha1",
            {"minMember": 3, "scheduleTimeoutSeconds": 60},
            "scheduler-plugins-scheduler",
        ),
    ],
)
def test_gang_scheduling_creates_a_pod_group_every_worker_joins(
    gang: dict[str, Any], api_version: str, spec: dict[str, Any], scheduler: str
) -> None:
    ctx = context(spec=trainer_spec(workers=3, gangScheduling=gang))
    group = builders.build_pod_group(ctx)
    assert group is not None
    assert group["apiVersion"] == api_version and group["kind"] == "PodGroup"
    assert group["metadata"]["name"] == "demo"
    assert group["spec"] == spec
    assert group["metadata"]["ownerReferences"][0]["controller"] is True
    template = builders.build_worker_job(ctx, 2)["spec"]["template"]
    assert template["spec"]["schedulerName"] == scheduler
    joined = {**template["metadata"]["labels"], **template["metadata"]["annotations"]}
    key = "scheduling.k8s.io/group-name" if gang["provider"] == "volcano" else "scheduling.x-k8s.io/pod-group"
    assert joined[key] == "demo"


def test_kubernetes_gang_scheduling_is_one_workload_and_one_pod_group_per_attempt_the_pods_name() -> None:
    ctx = context(spec=trainer_spec(workers=3, gangScheduling={"provider": "kubernetes"}), attempt=2)
    workload = builders.build_workload(ctx)
    assert workload is not None
    assert (workload["apiVersion"], workload["kind"], workload["metadata"]["name"]) == (
        "scheduling.k8s.io/v1beta1",
        "Workload",
        "demo",
    )
    assert workload["spec"] == {
        "controllerRef": {"apiGroup": "kubetrain.io", "kind": "TrainingJob", "name": "demo"},
        "podGroupTemplates": [{"name": "workers", "schedulingPolicy": {"gang": {"minCount": 3}}}],
    }
    group = builders.build_pod_group(ctx)
    assert group is not None
    assert (group["apiVersion"], group["kind"], group["metadata"]["name"]) == (
        "scheduling.k8s.io/v1beta1",
        "PodGroup",
        "demo-r2",
    )
    assert group["spec"] == {
        "workloadRef": {"workloadName": "demo", "templateName": "workers"},
        "schedulingPolicy": {"gang": {"minCount": 3}},
    }
    assert group["metadata"]["labels"]["kubetrain.io/restart-attempt"] == "2"
    for owned in (workload, group):
        assert owned["metadata"]["ownerReferences"][0]["controller"] is True
    pod = builders.build_worker_job(ctx, 1)["spec"]["template"]["spec"]
    assert pod["schedulingGroup"] == {"podGroupName": "demo-r2"}
    assert "schedulerName" not in pod  # the default scheduler gangs them


def test_a_kubernetes_gang_has_its_workers_priority() -> None:
    spec = trainer_spec(gangScheduling={"provider": "kubernetes"}, priorityClassName="research-high")
    ctx = context(spec=spec)
    workload, group = builders.build_workload(ctx), builders.build_pod_group(ctx)
    assert workload is not None and group is not None
    assert workload["spec"]["podGroupTemplates"][0]["priorityClassName"] == "research-high"
    assert group["spec"]["priorityClassName"] == "research-high"


def test_only_the_kubernetes_provider_has_a_workload() -> None:
    volcano = context(spec=trainer_spec(gangScheduling={"provider": "volcano"}))
    assert builders.build_workload(volcano) is None
    assert builders.build_workload(context()) is None
    assert "schedulingGroup" not in builders.build_worker_job(volcano, 0)["spec"]["template"]["spec"]


def test_an_explicit_scheduler_name_wins_and_no_gang_means_no_pod_group() -> None:
    ctx = context(spec=trainer_spec(schedulerName="my-volcano", gangScheduling={"provider": "volcano"}))
    assert builders.build_worker_job(ctx, 0)["spec"]["template"]["spec"]["schedulerName"] == "my-volcano"
    assert builders.build_pod_group(context()) is None


@pytest.mark.parametrize(
    ("spec_account", "operator_default", "expected"),
    [
        (None, None, None),
        (None, "kubetrain-worker", "kubetrain-worker"),
        ("mine", "kubetrain-worker", "mine"),
        ("mine", None, "mine"),
    ],
)
def test_worker_service_account_is_the_specs_else_the_operators_default(
    spec_account: str | None, operator_default: str | None, expected: str | None
) -> None:
    spec = trainer_spec()
    if spec_account:
        spec["serviceAccountName"] = spec_account
    ctx = dataclasses.replace(context(spec=spec), default_service_account=operator_default)
    pod_spec = builders.build_worker_job(ctx, 0)["spec"]["template"]["spec"]
    assert pod_spec.get("serviceAccountName") == expected


def test_a_users_dev_shm_volume_replaces_the_operators() -> None:
    """PyTorchJob manifests carry their own /dev/shm volume: it is mounted instead of the operator's,
    never beside it (two mounts at one path make the API server refuse the Job)."""
    spec = {
        **trainer_spec(),
        "storage": [{"name": "shm", "mountPath": "/dev/shm", "emptyDir": {"medium": "Memory"}}],
    }
    pod = builders.build_worker_job(context(spec=spec), 0)["spec"]["template"]["spec"]
    mounts = pod["containers"][0]["volumeMounts"]
    assert [m["mountPath"] for m in mounts] == ["/dev/shm"]
    assert [v["name"] for v in pod["volumes"]] == ["data-shm"]


def test_extended_resources_and_hugepages_requested_without_a_limit_get_an_equal_limit() -> None:
    spec = {
        **trainer_spec(),
        "resources": {
            "requests": {"cpu": "1", "example.com/fpga": 2, "hugepages-2Mi": "1Gi", "memory": "2Gi"}
        },
    }
    resources = _container(builders.build_worker_job(context(spec=spec), 0))["resources"]
    assert resources["limits"] == {"example.com/fpga": "2", "hugepages-2Mi": "1Gi"}
