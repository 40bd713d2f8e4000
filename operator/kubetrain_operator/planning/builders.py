"""Pure builders for a TrainingJob's children: `build_*(...) -> dict` manifests, no API calls.

Children: one headless Service (stable DNS for the workers) and, per restart attempt, one batch Job per
worker (completions 1, parallelism 1, backoffLimit 0: restarts belong to the operator, for the whole
group). Each pod's hostname is its Job's name and its subdomain the Service's, so worker i is reachable
at `<base>-r<attempt>-w<i>.<base>.<namespace>.svc` as soon as its pod exists (publishNotReadyAddresses).
With spec.gangScheduling, also the provider's group objects (a Workload and PodGroups; see gang).

Worker environment (see kubetrain_trainer.contract):

- WORLD_SIZE is the total number of training processes, workers x nprocPerWorker, never the number of
  nodes (PET_NNODES is that);
- RANK is the worker's first global rank, NODE_RANK x nprocPerWorker (torchrun overwrites RANK and
  LOCAL_RANK per process; with one process per worker RANK is the process's rank and LOCAL_RANK is 0);
- MASTER_ADDR/MASTER_PORT point at worker 0; PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR, PET_MASTER_PORT carry the same facts in the form torchrun reads as defaults;
- KUBETRAIN_JOB_NAME and KUBETRAIN_RESTART_ATTEMPT key checkpoints, KUBETRAIN_JOB_UID keeps a new job
  of the same name from resuming them; KUBETRAIN_TRAINER_CONFIG holds the built-in trainer's config as
  JSON; KUBETRAIN_TERMINATION_LOG is the terminationMessagePath where a failing process records its exit
  code; KUBETRAIN_POD_NAME/NAMESPACE come from the downward API.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from kubetrain_trainer import contract

from kubetrain_operator import api
from kubetrain_operator.api import constants, names, policies
from kubetrain_operator.planning import gang


@dataclasses.dataclass(frozen=True)
class Owner:
    """The TrainingJob a child belongs to."""

    name: str
    namespace: str
    uid: str


@dataclasses.dataclass(frozen=True)
class Placement:
    """What a queueing system's admission adds to every worker pod (Kueue: the assigned ResourceFlavors'
    node labels and tolerations, see queueing.placement). The spec's own values stay; on a node-selector
    key both name, the admission wins (the quota it granted is for that flavor's nodes)."""

    node_selector: dict[str, str] = dataclasses.field(default_factory=dict)
    tolerations: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    labels: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Context:
    """Everything a builder needs: the owner, its validated spec, the attempt and operator defaults."""

    owner: Owner
    spec: api.TrainingJobSpec
    restart_attempt: int = 0
    default_image: str = constants.TRAINER_IMAGE
    default_service_account: str | None = None
    """Workers' ServiceAccount when spec.serviceAccountName is empty (the chart's kubetrain-worker, which
    may patch its own pod's progress annotation); None leaves the namespace's default account."""
    placement: Placement | None = None
    """The admission's additions to the worker pods; None when no queueing system admitted the job."""
    store_placement: Placement | None = None
    """The admission's additions to an elastic job's rendezvous store pod (its own pod set)."""
    default_gang_provider: api.GangProvider | None = None
    """The gang scheduler for a spec.gangScheduling naming no provider (see gang.default_provider)."""
    store_generation: int = 0
    """An elastic group's current rendezvous store (status.elastic.storeGeneration)."""

    @property
    def gang_provider(self) -> api.GangProvider | None:
        return gang.provider(self.spec, self.default_gang_provider)


RESTRICTED_POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "fsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""Pod securityContext passing the `restricted` Pod Security Standard; uid/gid 1000 own written files."""

RESTRICTED_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}

SHM_VOLUME = "dshm"
"""A memory-backed /dev/shm: the container default (64 MiB) breaks DataLoader workers and NCCL. A
spec.storage volume mounted at /dev/shm (as PyTorchJob manifests carry) replaces it."""
SHM_PATH = "/dev/shm"


def owner_reference(owner: Owner) -> dict[str, Any]:
    """Controller reference: deleting the TrainingJob deletes the child through the garbage collector."""
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def selector_labels(job_name: str) -> dict[str, str]:
    """Labels selecting every child (and pod) of a TrainingJob."""
    return {constants.LABEL_JOB_NAME: names.job_label_value(job_name)}


def worker_labels(job_name: str, restart_attempt: int, index: int) -> dict[str, str]:
    return {
        **selector_labels(job_name),
        constants.LABEL_WORKER_INDEX: str(index),
        constants.LABEL_RESTART_ATTEMPT: str(restart_attempt),
        constants.LABEL_ROLE: "master" if index == 0 else "worker",
        constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
    }


def _metadata(ctx: Context, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ctx.owner.namespace,
        "labels": labels,
        "annotations": {constants.ANNOTATION_JOB_NAME: ctx.owner.name},
        "ownerReferences": [owner_reference(ctx.owner)],
    }


def build_service(ctx: Context) -> dict[str, Any]:
    """The headless Service giving workers DNS names before they are ready (rendezvous needs that)."""
    port = ctx.spec.master_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(
            ctx,
            names.service_name(ctx.owner.name),
            {**selector_labels(ctx.owner.name), constants.LABEL_MANAGED_BY: constants.MANAGED_BY},
        ),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(ctx.owner.name),
            "ports": [
                {"name": constants.SERVICE_PORT_NAME, "port": port, "targetPort": port, "protocol": "TCP"}
            ],
        },
    }


ELASTIC_AGENT_RESTARTS = 100
"""torchrun --max-restarts on elastic workers. A membership change that breaks a collective (a peer lost or
removed) makes each survivor's processes fail once and its agent restart them into the next rendezvous
round, so this bounds how many such changes one worker lives through; the operator's replacement budget
(runPolicy.maxRestarts) is what ends a crash loop."""

ELASTIC_JOIN_TIMEOUT_SECONDS = 7 * 24 * 3600
"""torchrun's join_timeout on elastic workers: a worker waits in the rendezvous until minWorkers are there
however long capacity takes to return (torchrun's 600 s default would turn a wait for an unschedulable
pod into worker failures); activeDeadlineSeconds is what bounds the wait."""


def _fixed_size_env(ctx: Context, index: int) -> list[tuple[str, str]]:
    """A fixed-size group's places: every worker knows the world size, its ranks and worker 0's address."""
    spec = ctx.spec
    nproc = spec.procs_per_worker()
    master = names.worker_dns(ctx.owner.name, ctx.owner.namespace, ctx.restart_attempt, 0)
    port = str(spec.master_port)
    values: list[tuple[str, str]] = [
        (contract.MASTER_ADDR, master),
        (contract.MASTER_PORT, port),
        (contract.WORLD_SIZE, str(spec.world_size())),
        (contract.RANK, str(index * nproc)),
        (contract.NODE_RANK, str(index)),
        (contract.LOCAL_WORLD_SIZE, str(nproc)),
    ]
    if nproc == 1:
        values.append((contract.LOCAL_RANK, "0"))
    return [
        *values,
        (contract.PET_NNODES, str(spec.workers)),
        (contract.PET_NPROC_PER_NODE, str(nproc)),
        (contract.PET_NODE_RANK, str(index)),
        (contract.PET_MASTER_ADDR, master),
        (contract.PET_MASTER_PORT, port),
    ]


def _elastic_env(ctx: Context, index: int) -> list[tuple[str, str]]:
    """An elastic worker's torchrun settings: ranks, WORLD_SIZE and MASTER_* are torchrun's to set per
    rendezvous round, so only the rendezvous is given (see docs/elastic.md)."""
    spec = ctx.spec
    assert spec.elastic is not None
    conf = (
        f"is_host=false,join_timeout={ELASTIC_JOIN_TIMEOUT_SECONDS},"
        f"last_call_timeout={spec.elastic.last_call_seconds}"
    )
    store = names.rendezvous_dns(ctx.owner.name, ctx.owner.namespace, ctx.store_generation)
    endpoint = f"{store}:{spec.master_port}"
    return [
        (contract.PET_NNODES, f"{spec.elastic.min_workers}:{spec.elastic.max_workers}"),
        (contract.PET_NPROC_PER_NODE, str(spec.procs_per_worker())),
        (contract.PET_RDZV_BACKEND, "c10d"),
        (contract.PET_RDZV_ENDPOINT, endpoint),
        (contract.PET_RDZV_ID, ctx.owner.uid),
        (contract.PET_RDZV_CONF, conf),
        (contract.PET_MAX_RESTARTS, str(ELASTIC_AGENT_RESTARTS)),
        (
            contract.PET_LOCAL_ADDR,
            names.worker_dns(ctx.owner.name, ctx.owner.namespace, ctx.restart_attempt, index),
        ),
        (contract.TORCH_DISABLE_SHARE_RDZV_TCP_STORE, "1"),
    ]


def worker_env(ctx: Context, index: int) -> list[dict[str, Any]]:
    """The env contract of worker `index`, then the user's env (which may refer to it as $(RANK))."""
    spec = ctx.spec
    values = _elastic_env(ctx, index) if spec.elastic is not None else _fixed_size_env(ctx, index)
    values += [
        (contract.JOB_NAME, ctx.owner.name),
        (contract.JOB_UID, ctx.owner.uid),
        (contract.RESTART_ATTEMPT, str(ctx.restart_attempt)),
        (contract.TERMINATION_LOG, contract.TERMINATION_LOG_PATH),
    ]
    deadline = spec.failure_policy.progress_deadline_seconds
    if deadline is not None:
        values.append((contract.HEARTBEAT_SECONDS, str(policies.heartbeat_seconds(deadline))))
    if spec.trainer is not None:
        values.append(
            (contract.TRAINER_CONFIG, json.dumps(spec.trainer.model_dump(mode="json"), separators=(",", ":")))
        )
    values.append(("PYTHONUNBUFFERED", "1"))
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values]
    env += [
        {"name": contract.POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": contract.POD_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    for var in spec.env or ():
        env.append(var.model_dump(by_alias=True, exclude_none=True))
    return env


def worker_command(spec: api.TrainingJobSpec) -> tuple[list[str], list[str] | None]:
    """Container command and args: the built-in trainer or the user's program, under torchrun or not."""
    if spec.trainer is not None:
        if spec.procs_per_worker() > 1 or spec.elastic is not None:
            return ["torchrun", "--no-python", "kubetrain", "train"], None
        return ["kubetrain", "train"], None
    assert spec.command is not None  # the spec validator guarantees trainer xor command
    if spec.launcher == "torchrun":
        return ["torchrun", "--no-python", *spec.command], list(spec.args) if spec.args else None
    return list(spec.command), list(spec.args) if spec.args else None


def worker_resources(spec: api.TrainingJobSpec) -> dict[str, Any]:
    """requests/limits; a request of an extended resource (nvidia.com/gpu) or hugepages without a limit
    gets the same limit: the API server refuses such a request without one."""
    if spec.resources is None:
        return {}
    out: dict[str, Any] = {}
    requests = dict(spec.resources.requests or {})
    limits = dict(spec.resources.limits or {})
    for name, quantity in requests.items():
        if api.request_must_equal_limit(name):
            limits.setdefault(name, quantity)
    if requests:
        out["requests"] = {k: str(v) for k, v in requests.items()}
    if limits:
        out["limits"] = {k: str(v) for k, v in limits.items()}
    return out


def worker_volumes(spec: api.TrainingJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container volumeMounts) for spec.storage plus the shared-memory volume, unless
    spec.storage mounts its own at /dev/shm."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if all(vol.mount_path != SHM_PATH for vol in spec.storage or ()):
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
    for vol in spec.storage or ():
        name = f"data-{vol.name}"
        volume: dict[str, Any] = {"name": name}
        read_only = False
        if vol.persistent_volume_claim is not None:
            read_only = vol.persistent_volume_claim.read_only
            volume["persistentVolumeClaim"] = {"claimName": vol.persistent_volume_claim.claim_name}
            if read_only:
                volume["persistentVolumeClaim"]["readOnly"] = True
        elif vol.host_path is not None:
            volume["hostPath"] = {"path": vol.host_path.path}
            if vol.host_path.type:
                volume["hostPath"]["type"] = vol.host_path.type
        elif vol.empty_dir is not None:
            volume["emptyDir"] = {}
            if vol.empty_dir.medium:
                volume["emptyDir"]["medium"] = vol.empty_dir.medium
            if vol.empty_dir.size_limit is not None:
                volume["emptyDir"]["sizeLimit"] = str(vol.empty_dir.size_limit)
        volumes.append(volume)
        mount: dict[str, Any] = {"name": name, "mountPath": vol.mount_path}
        if vol.sub_path:
            mount["subPath"] = vol.sub_path
        if read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    return volumes, mounts


def build_pod_template(ctx: Context, index: int) -> dict[str, Any]:
    spec = ctx.spec
    job_name = names.worker_job_name(ctx.owner.name, ctx.restart_attempt, index)
    command, args = worker_command(spec)
    volumes, mounts = worker_volumes(spec)
    container: dict[str, Any] = {
        "name": constants.CONTAINER_NAME,
        "image": spec.image or ctx.default_image,
        "command": command,
        "env": worker_env(ctx, index),
        "ports": [
            {"name": constants.SERVICE_PORT_NAME, "containerPort": spec.master_port, "protocol": "TCP"}
        ],
        "volumeMounts": mounts,
        "securityContext": dict(RESTRICTED_CONTAINER_SECURITY),
        # The trainer records its exit code there (torchrun exits 1 for any child); when nothing was
        # recorded, the log's tail (torchrun's failure report) is the message.
        "terminationMessagePath": contract.TERMINATION_LOG_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if args:
        container["args"] = args
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    resources = worker_resources(spec)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": job_name,
        "subdomain": names.service_name(ctx.owner.name),
        "enableServiceLinks": False,
        "securityContext": dict(RESTRICTED_POD_SECURITY),
        "containers": [container],
        "volumes": volumes,
    }
    optional: dict[str, Any] = {
        "nodeSelector": spec.node_selector,
        "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations or ()],
        "affinity": spec.affinity.model_dump(by_alias=True, exclude_none=True) if spec.affinity else None,
        "priorityClassName": spec.priority_class_name,
        "schedulerName": spec.scheduler_name,
        "serviceAccountName": spec.service_account_name or ctx.default_service_account,
    }
    if ctx.placement is not None:
        optional["nodeSelector"] = {**(spec.node_selector or {}), **ctx.placement.node_selector}
        optional["tolerations"] += [t for t in ctx.placement.tolerations if t not in optional["tolerations"]]
    pod_spec.update({k: v for k, v in optional.items() if v})
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": ref.name} for ref in spec.image_pull_secrets]
    labels = {**(spec.pod_labels or {}), **worker_labels(ctx.owner.name, ctx.restart_attempt, index)}
    if ctx.placement is not None:
        labels.update(ctx.placement.labels)
    annotations = {**(spec.pod_annotations or {}), constants.ANNOTATION_JOB_NAME: ctx.owner.name}
    provider = ctx.gang_provider
    if provider is not None:
        group = gang.group_name(provider, ctx.owner.name, ctx.restart_attempt)
        if provider == "kubernetes":
            pod_spec["schedulingGroup"] = {"podGroupName": group}
        elif provider == "volcano":
            annotations[constants.VOLCANO_GROUP_ANNOTATION] = group
            pod_spec.setdefault("schedulerName", constants.VOLCANO_SCHEDULER)
        else:
            labels[constants.COSCHEDULING_GROUP_LABEL] = group
            pod_spec.setdefault("schedulerName", constants.COSCHEDULING_SCHEDULER)
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec}


def _gang_group(ctx: Context) -> dict[str, Any]:
    """What a Workload's podGroupTemplate and a PodGroup say alike: all `workers` or none, at the workers'
    priority (copied as the Job controller copies its pod template's; without it the group, which the
    scheduler queues and preempts as one, would have priority 0 whatever its pods have)."""
    group: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": ctx.spec.workers}}}
    if ctx.spec.priority_class_name:
        group["priorityClassName"] = ctx.spec.priority_class_name
    return group


def build_workload(ctx: Context) -> dict[str, Any] | None:
    """The Workload of a TrainingJob gang-scheduled by Kubernetes (None for any other provider): its one
    podGroupTemplate says all `workers` pods or none. Made with the Service, once per TrainingJob."""
    if ctx.gang_provider != "kubernetes":
        return None
    labels = {**selector_labels(ctx.owner.name), constants.LABEL_MANAGED_BY: constants.MANAGED_BY}
    return {
        "apiVersion": constants.KUBERNETES_SCHEDULING_API,
        "kind": "Workload",
        "metadata": _metadata(ctx, names.service_name(ctx.owner.name), labels),
        "spec": {
            "controllerRef": {"apiGroup": constants.GROUP, "kind": constants.KIND, "name": ctx.owner.name},
            "podGroupTemplates": [
                {"name": constants.WORKLOAD_TEMPLATE, **_gang_group(ctx)},
            ],
        },
    }


def build_pod_group(ctx: Context) -> dict[str, Any] | None:
    """The group asking the gang scheduler to place every worker at once (None without gangScheduling).

    kubernetes: one per restart attempt (see gang), made from the Workload's template with the attempt's
    Jobs. volcano and scheduler-plugins: one per TrainingJob, made with the Service and reused by every
    attempt: the operator starts an attempt only after the previous attempt's Jobs are gone.
    """
    provider = ctx.gang_provider
    if provider is None:
        return None
    labels = {**selector_labels(ctx.owner.name), constants.LABEL_MANAGED_BY: constants.MANAGED_BY}
    if provider in gang.PER_ATTEMPT_GROUPS:
        labels[constants.LABEL_RESTART_ATTEMPT] = str(ctx.restart_attempt)
    metadata = _metadata(ctx, gang.group_name(provider, ctx.owner.name, ctx.restart_attempt), labels)
    if provider == "kubernetes":
        return {
            "apiVersion": constants.KUBERNETES_SCHEDULING_API,
            "kind": "PodGroup",
            "metadata": metadata,
            "spec": {
                "workloadRef": {
                    "workloadName": names.service_name(ctx.owner.name),
                    "templateName": constants.WORKLOAD_TEMPLATE,
                },
                **_gang_group(ctx),
            },
        }
    gang_spec = ctx.spec.gang_scheduling
    assert gang_spec is not None  # a provider implies spec.gangScheduling
    spec: dict[str, Any] = {"minMember": ctx.spec.workers}
    if provider == "volcano":
        if gang_spec.queue:
            spec["queue"] = gang_spec.queue
        api_version = constants.VOLCANO_PODGROUP_API
    else:
        if gang_spec.schedule_timeout_seconds:
            spec["scheduleTimeoutSeconds"] = gang_spec.schedule_timeout_seconds
        api_version = constants.COSCHEDULING_PODGROUP_API
    return {"apiVersion": api_version, "kind": "PodGroup", "metadata": metadata, "spec": spec}


DISRUPTION_POD_FAILURE_POLICY: dict[str, Any] = {
    "rules": [
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
}
"""The Job fails as it would anyway (backoffLimit 0), but with reason PodFailurePolicy and a message
naming DisruptionTarget, so a disruption is still told from a crash once its pod is gone (see
`observe.read_worker`). A Job with a podFailurePolicy also counts a terminating pod as failed only once it
reached a terminal phase: the Job does not fail while the pod's process may still write."""


def build_worker_job(ctx: Context, index: int) -> dict[str, Any]:
    """Worker `index`'s batch Job for `ctx.restart_attempt`: one pod, never retried by the Job controller."""
    name = names.worker_job_name(ctx.owner.name, ctx.restart_attempt, index)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(ctx, name, worker_labels(ctx.owner.name, ctx.restart_attempt, index)),
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 0,
            "podFailurePolicy": DISRUPTION_POD_FAILURE_POLICY,
            "template": build_pod_template(ctx, index),
        },
    }


def build_worker_jobs(ctx: Context) -> list[dict[str, Any]]:
    return [build_worker_job(ctx, i) for i in range(ctx.spec.workers)]


def build_rendezvous_job(ctx: Context) -> dict[str, Any] | None:
    """An elastic job's rendezvous store (None for a fixed-size job): one pod serving torchrun's c10d
    TCPStore at `<base>-rdzv.<service>` on masterPort, apart from every worker, so that losing any worker
    (worker 0 included) leaves the rendezvous standing. It runs the operator's trainer image, which has
    the store's module, whatever image the workers run; it trains nothing and needs little."""
    if ctx.spec.elastic is None:
        return None
    name = names.rendezvous_job_name(ctx.owner.name, ctx.store_generation)
    port = ctx.spec.master_port
    labels = {
        **selector_labels(ctx.owner.name),
        constants.LABEL_ROLE: constants.ROLE_RENDEZVOUS,
        constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
    }
    container: dict[str, Any] = {
        "name": constants.RENDEZVOUS_CONTAINER_NAME,
        "image": ctx.default_image,
        "command": ["python", "-m", "kubetrain_trainer.rendezvous_store", "--port", str(port)],
        "ports": [{"name": constants.SERVICE_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": dict(RESTRICTED_CONTAINER_SECURITY),
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": name,
        "subdomain": names.service_name(ctx.owner.name),
        "enableServiceLinks": False,
        "securityContext": dict(RESTRICTED_POD_SECURITY),
        "containers": [container],
    }
    optional = {
        "nodeSelector": ctx.spec.node_selector,
        "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in ctx.spec.tolerations or ()],
        "priorityClassName": ctx.spec.priority_class_name,
    }
    where = ctx.store_placement
    if where is not None:
        optional["nodeSelector"] = {**(ctx.spec.node_selector or {}), **where.node_selector}
        optional["tolerations"] += [t for t in where.tolerations if t not in optional["tolerations"]]
    pod_spec.update({k: v for k, v in optional.items() if v})
    pod_metadata = {
        # Like the workers' pods: mesh and network-policy labels and annotations concern the store too.
        "labels": {**(ctx.spec.pod_labels or {}), **labels, **(where.labels if where else {})},
        "annotations": {**(ctx.spec.pod_annotations or {}), constants.ANNOTATION_JOB_NAME: ctx.owner.name},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(ctx, name, labels),
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 0,
            "podFailurePolicy": DISRUPTION_POD_FAILURE_POLICY,
            "template": {"metadata": pod_metadata, "spec": pod_spec},
        },
    }
