"""Where and how workers are scheduled: image pull secrets, affinity, tolerations and gang scheduling. All
but gangScheduling may change on a running job (they apply to workers created afterwards).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from kubetrain_operator.api import base


class SecretReference(base.Model):
    name: str = Field(
        ...,
        min_length=1,
        max_length=253,
        pattern=base.DNS_SUBDOMAIN_PATTERN,
        description="name of a Secret in the TrainingJob's namespace (kubernetes.io/dockerconfigjson).",
    )


class Affinity(base.Model):
    """Pod affinity as in Kubernetes. Its three kinds are named here, so a misspelt kind is refused rather
    than dropped; what is inside each is checked by the API server when the worker Job is created."""

    node_affinity: dict[str, Any] | None = Field(
        None, description="nodeAffinity places workers on nodes by label (Kubernetes syntax)."
    )
    pod_affinity: dict[str, Any] | None = Field(
        None, description="podAffinity places workers near pods by label (Kubernetes syntax)."
    )
    pod_anti_affinity: dict[str, Any] | None = Field(
        None, description="podAntiAffinity keeps workers away from pods by label (Kubernetes syntax)."
    )


class Toleration(base.Model):
    """A pod toleration, as in Kubernetes: lets workers run on nodes with a matching taint."""

    model_config = ConfigDict(
        json_schema_extra=base.schema_extra(
            base.cel_rule(
                "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
                "value must be empty when operator is Exists",
                ".value",
            ),
            base.cel_rule(
                "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
                "operator must be Exists when key is empty (a toleration of every taint)",
                ".operator",
            ),
            base.cel_rule(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                "tolerationSeconds needs effect NoExecute",
                ".tolerationSeconds",
            ),
        )
    )

    key: str | None = Field(
        None,
        max_length=317,
        pattern=r"^$|" + base.LABEL_KEY_PATTERN,
        description="key is the taint key to tolerate (a label key); empty with operator Exists matches all.",
    )
    operator: Literal["", "Exists", "Equal"] | None = Field(
        None, description="operator is Equal (key and value match, the default) or Exists (any value)."
    )
    value: str | None = Field(
        None,
        max_length=63,
        pattern=base.LABEL_VALUE_PATTERN,
        description="value is the taint value to match under operator Equal (a label value).",
    )
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None,
        description="effect is the taint effect to match: NoSchedule, PreferNoSchedule, NoExecute or all.",
    )
    toleration_seconds: int | None = Field(
        None,
        description=(
            "tolerationSeconds is how long a NoExecute taint is tolerated before eviction. Default: forever."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        if not self.key and self.operator != "Exists":
            raise ValueError("operator must be Exists when key is empty (a toleration of every taint)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute")
        return self


GangProvider = Literal["kubernetes", "volcano", "scheduler-plugins"]


class GangScheduling(base.Model):
    """All workers are placed together or not at all, by a gang scheduler (see `gang`)."""

    provider: GangProvider | None = Field(
        None,
        description=(
            "provider is the gang scheduler: kubernetes (the default scheduler's gang scheduling, "
            "Kubernetes 1.37+ with the GenericWorkload feature gate and scheduling.k8s.io/v1beta1 served: "
            "one Workload named like the Service, and per restart attempt one PodGroup "
            "<service>-r<attempt>, which the pods join through spec.schedulingGroup), volcano (a "
            "scheduling.volcano.sh/v1beta1 PodGroup, pods annotated scheduling.k8s.io/group-name) or "
            "scheduler-plugins (a scheduling.x-k8s.io/v1alpha1 PodGroup for the Coscheduling plugin, pods "
            "labelled scheduling.x-k8s.io/pod-group). Every group requires all workers (minCount or "
            "minMember = workers); the volcano and scheduler-plugins PodGroups are named like the Service. "
            "Default: the first of kubernetes, volcano, scheduler-plugins whose API the cluster served when "
            "the operator started."
        ),
    )
    queue: str | None = Field(
        None,
        max_length=253,
        description="queue is the Volcano queue of the PodGroup. Default: Volcano's default.",
    )
    schedule_timeout_seconds: int | None = Field(
        None,
        ge=1,
        description=(
            "scheduleTimeoutSeconds is how long scheduler-plugins waits for the whole group before giving "
            "up a scheduling cycle. Default: the plugin's default."
        ),
    )
