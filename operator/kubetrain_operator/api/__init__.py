"""The TrainingJob API (kubetrain.io/v1alpha1): pydantic models for spec and status.

These models are the one source of truth: `crdgen` turns their JSON schema into the CRD's
openAPIV3Schema, and the operator validates every object it reconciles with them. Every field's
description starts with its JSON name and says its default, unit, format and whether it can change
after creation, because it becomes `kubectl explain trainingjob.spec.<field>` text.

Rules the schema keywords cannot say are written twice on purpose: as CEL `x-kubernetes-validations`
(so `kubectl apply` refuses a bad object, naming its field, and nothing is created) and as pydantic
validators (so the operator refuses the same object when the CRD was installed without them). The table
tests/operator/testdata/refused-trainingjobs.yaml holds both sides to the same verdict: unit tests run it
through the models, cluster tests through a real API server.

Mutability, in one place: the shape of the group (image, imagePullPolicy, workers, nprocPerWorker,
resources, trainer, command, args, launcher, storage, masterPort, successPolicy, gangScheduling,
elastic) is
immutable, because changing it under a running DDP group has no safe meaning; only an elastic job's
workers may change (`kubectl scale`: torchrun re-rendezvouses the group). Run and failure policies, and the
scheduling and pod-metadata fields (env, imagePullSecrets, nodeSelector, tolerations, affinity,
priorityClassName, schedulerName, serviceAccountName, podLabels, podAnnotations), can change at any
time; scheduling and pod-metadata changes apply to workers created afterwards (the next restart attempt
or resume), which is what queueing systems such as Kueue need when they admit a suspended job (the
Workload of a job queued in Kueue keeps the values it was created with). `jobspec` holds the list
(IMMUTABLE_SPEC_FIELDS) and the rules that keep it.

The models live by concern, each module building only on those before it: `base` (the model base
class, CEL helpers, shared patterns), `quantities`, `compute` (resources), `volumes`, `environment`,
`scheduling`, `policies`, `jobspec`, `jobstatus` and `trainingjob` (the whole object). This package's face
re-exports their public names, so callers write `from kubetrain_operator import api` and `api.<Name>`;
modules inside the package import each other as modules, never through this face. Beside them:
`constants`, `names` and `fieldpaths`, and the generators `crdgen` (the CRD) and `apidocs` (its
reference page).
"""

from kubetrain_operator.api.base import (
    DNS_SUBDOMAIN_PATTERN,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    is_label_key,
)
from kubetrain_operator.api.compute import STANDARD_RESOURCES, Resources, request_must_equal_limit
from kubetrain_operator.api.environment import (
    CONFIG_KEY_PATTERN,
    DIVISORS,
    ENV_FIELD_PATH_PATTERN,
    RESERVED_ENV,
    RESERVED_ENV_PREFIXES,
    EnvVar,
    EnvVarSource,
    KeySelector,
    ObjectFieldSelector,
    ResourceFieldSelector,
    env_name_reserved,
)
from kubetrain_operator.api.jobspec import (
    ELASTIC_MUTABLE_SPEC_FIELDS,
    IMAGE_PATTERN,
    IMMUTABLE_BY_CHILD,
    IMMUTABLE_CHILDREN,
    IMMUTABLE_SPEC_FIELDS,
    MANAGED_BY_PATTERN,
    LabelValue,
    TrainingJobSpec,
    immutable_child_rules,
)
from kubetrain_operator.api.jobstatus import (
    CONDITION_TYPES,
    PHASES,
    TERMINAL_PHASES,
    UNWRITTEN_STATUS,
    Condition,
    ConditionType,
    ElasticStatus,
    Phase,
    Progress,
    ResumedFrom,
    TrainingJobStatus,
    WorkerCounts,
    WorkerFailure,
)
from kubetrain_operator.api.policies import (
    ELASTIC_LAST_CALL_SECONDS,
    MAX_RESTARTS,
    MAX_WORKERS,
    Elastic,
    FailurePolicy,
    RunPolicy,
)
from kubetrain_operator.api.quantities import (
    QUANTITY_MESSAGE,
    QUANTITY_PATTERN,
    QUANTITY_RULE,
    Quantity,
    quantity_value,
)
from kubetrain_operator.api.scheduling import (
    Affinity,
    GangProvider,
    GangScheduling,
    SecretReference,
    Toleration,
)
from kubetrain_operator.api.trainingjob import TrainingJob
from kubetrain_operator.api.volumes import (
    EmptyDirSource,
    HostPathSource,
    PVCSource,
    StorageVolume,
    is_clean_mount_path,
    is_descending_path,
)

__all__ = [
    "CONDITION_TYPES",
    "CONFIG_KEY_PATTERN",
    "DIVISORS",
    "DNS_SUBDOMAIN_PATTERN",
    "ELASTIC_LAST_CALL_SECONDS",
    "ELASTIC_MUTABLE_SPEC_FIELDS",
    "ENV_FIELD_PATH_PATTERN",
    "IMAGE_PATTERN",
    "IMMUTABLE_BY_CHILD",
    "IMMUTABLE_CHILDREN",
    "IMMUTABLE_SPEC_FIELDS",
    "LABEL_KEY_PATTERN",
    "LABEL_VALUE_PATTERN",
    "MANAGED_BY_PATTERN",
    "MAX_RESTARTS",
    "MAX_WORKERS",
    "PHASES",
    "QUANTITY_MESSAGE",
    "QUANTITY_PATTERN",
    "QUANTITY_RULE",
    "RESERVED_ENV",
    "RESERVED_ENV_PREFIXES",
    "STANDARD_RESOURCES",
    "TERMINAL_PHASES",
    "UNWRITTEN_STATUS",
    "Affinity",
    "Condition",
    "ConditionType",
    "Elastic",
    "ElasticStatus",
    "EmptyDirSource",
    "EnvVar",
    "EnvVarSource",
    "FailurePolicy",
    "GangProvider",
    "GangScheduling",
    "HostPathSource",
    "KeySelector",
    "LabelValue",
    "ObjectFieldSelector",
    "PVCSource",
    "Phase",
    "Progress",
    "Quantity",
    "ResourceFieldSelector",
    "Resources",
    "ResumedFrom",
    "RunPolicy",
    "SecretReference",
    "StorageVolume",
    "Toleration",
    "TrainingJob",
    "TrainingJobSpec",
    "TrainingJobStatus",
    "WorkerCounts",
    "WorkerFailure",
    "env_name_reserved",
    "immutable_child_rules",
    "is_clean_mount_path",
    "is_descending_path",
    "is_label_key",
    "quantity_value",
    "request_must_equal_limit",
]
