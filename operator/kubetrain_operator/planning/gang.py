"""Gang scheduling (spec.gangScheduling): which scheduler places a TrainingJob's workers all at once. Pure.

A DDP group is useless until every worker runs, so a half-placed group only holds devices while it waits
(two 4-worker jobs on room for 6 can each get 3 and wait forever). Three providers, each told through
objects the operator creates before the workers' Jobs:

- kubernetes: the default scheduler's own gang scheduling (KEP-4671, scheduling.k8s.io/v1beta1 in
  Kubernetes 1.37, feature gate GenericWorkload on the API server, scheduler and controller manager, and
  `--runtime-config=scheduling.k8s.io/v1beta1=true`). One Workload per TrainingJob (its podGroupTemplate
  `workers` with gang minCount = workers) and one PodGroup per restart attempt, which the attempt's pods
  join through `spec.schedulingGroup.podGroupName`. A pod naming a group keeps the Job controller from
  making a Workload of its own for each worker Job (getManagementMode in pkg/controller/job), so each
  TrainingJob is exactly one gang of `workers` pods, not one per Job. A fresh group per attempt: a group
  never counts pods of an earlier attempt (one stuck terminating on a lost node, say), and the
  scheduler's PodGroupInitiallyScheduled condition, final once True, describes this attempt's placement.
- volcano: one scheduling.volcano.sh/v1beta1 PodGroup per TrainingJob, pods annotated
  scheduling.k8s.io/group-name and scheduled by `volcano`.
- scheduler-plugins: one scheduling.x-k8s.io/v1alpha1 PodGroup per TrainingJob for the Coscheduling
  plugin, pods labelled scheduling.x-k8s.io/pod-group and scheduled by `scheduler-plugins-scheduler`.

spec.gangScheduling.provider may be left out: the operator then uses the first of these its cluster
serves (`default_provider`, from discovery when it starts), so one manifest gangs on any of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from kubetrain_operator import api
from kubetrain_operator.api import constants, names

REQUIRED_RESOURCES: dict[api.GangProvider, tuple[str, frozenset[str]]] = {
    "kubernetes": (constants.KUBERNETES_SCHEDULING_API, frozenset({"workloads", "podgroups"})),
    "volcano": (constants.VOLCANO_PODGROUP_API, frozenset({"podgroups"})),
    "scheduler-plugins": (constants.COSCHEDULING_PODGROUP_API, frozenset({"podgroups"})),
}
"""Per provider, the API group version and the resources it must serve for the operator to use it. The
dict's order is the order of preference for the default: the scheduler every cluster has first."""

PER_ATTEMPT_GROUPS = frozenset({"kubernetes"})
"""Providers whose PodGroup is made per restart attempt (the others keep one for the TrainingJob)."""


def default_provider(served: Mapping[str, Set[str]]) -> api.GangProvider | None:
    """The provider for a TrainingJob that names none: the first in REQUIRED_RESOURCES whose resources
    the cluster serves. `served` maps an API group version to its resources (from discovery)."""
    for provider, (api_version, resources) in REQUIRED_RESOURCES.items():
        if resources <= served.get(api_version, frozenset()):
            return provider
    return None


def provider(spec: api.TrainingJobSpec, default: api.GangProvider | None) -> api.GangProvider | None:
    """The provider gang-scheduling this spec's workers: None without spec.gangScheduling, or when it
    names none and the cluster serves none (`missing_provider` then says so)."""
    if spec.gang_scheduling is None:
        return None
    return spec.gang_scheduling.provider or default


def missing_provider(spec: api.TrainingJobSpec, default: api.GangProvider | None) -> str | None:
    """Why the spec cannot be gang-scheduled here, or None when it can (or asks for no gang)."""
    if spec.gang_scheduling is None or provider(spec, default) is not None:
        return None
    wanted = ", ".join(f"{name} ({REQUIRED_RESOURCES[name][0]})" for name in REQUIRED_RESOURCES)
    return (
        "spec.gangScheduling names no provider and the cluster served none of "
        f"{wanted} when the operator started: name spec.gangScheduling.provider, or enable one (for "
        "kubernetes, the GenericWorkload feature gate and --runtime-config=scheduling.k8s.io/v1beta1=true) "
        "and restart the operator"
    )


def group_name(provider: api.GangProvider, job_name: str, restart_attempt: int) -> str:
    """The PodGroup the workers of `restart_attempt` join."""
    if provider in PER_ATTEMPT_GROUPS:
        return names.attempt_pod_group_name(job_name, restart_attempt)
    return names.service_name(job_name)


def waiting_message(
    provider: api.GangProvider, job_name: str, restart_attempt: int, workers: int, scheduler_says: str | None
) -> str:
    """Why an unplaced gang waits: a worker's own message (one that fits alone is refused too, with the
    group's reason) reads as if that worker were the problem, so say first that it is all or none."""
    group = group_name(provider, job_name, restart_attempt)
    return (
        f"gang-scheduled ({provider}, PodGroup {group}): no worker starts until all {workers} fit at once; "
        f"the scheduler says: {scheduler_says or 'nothing yet'}"
    )
