"""API coordinates, label keys and fixed names shared by every layer of the operator."""

from kubetrain_operator import __version__

GROUP = "kubetrain.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
SINGULAR = "trainingjob"
SHORT_NAMES = ("tj",)
CATEGORIES = ("kubetrain",)
CRD_NAME = f"{PLURAL}.{GROUP}"

# Labels on every child (Service, Jobs, their pods). Values are label-safe (<= 63 chars), see names.py.
LABEL_JOB_NAME = "kubetrain.io/job-name"
"""The owning TrainingJob's name (hashed when longer than 63 characters); selects all children."""
LABEL_WORKER_INDEX = "kubetrain.io/worker-index"
"""The worker's index in the group, 0 being the master (Jobs and pods only)."""
LABEL_RESTART_ATTEMPT = "kubetrain.io/restart-attempt"
"""The restart attempt that created the Job (0 for the first run; Jobs and pods only)."""
LABEL_ROLE = "kubetrain.io/role"
"""'master' for worker 0, 'worker' for the others, 'rendezvous' for an elastic job's rendezvous store."""
ROLE_RENDEZVOUS = "rendezvous"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubetrain"

RESERVED_LABEL_PREFIX = "kubetrain.io/"

MANAGED_BY_CONTROLLER = "kubetrain.io/trainingjob-controller"
"""spec.managedBy of TrainingJobs the kubetrain operator reconciles (the same as leaving it unset)."""

ANNOTATION_JOB_NAME = "kubetrain.io/job-full-name"
"""The owning TrainingJob's full name, for humans when the label had to be hashed."""

CONTAINER_NAME = "worker"
"""Name of the one container in every worker pod; the operator reads its exit code."""
RENDEZVOUS_CONTAINER_NAME = "rendezvous"
"""The one container of an elastic job's rendezvous-store pod."""
DEFAULT_MASTER_PORT = 29500
SERVICE_PORT_NAME = "rendezvous"

GPU_RESOURCE = "nvidia.com/gpu"

FIELD_MANAGER = "kubetrain-operator"

# Gang scheduling (spec.gangScheduling, see gang.py): group kinds and how pods join them.
KUBERNETES_SCHEDULING_API = "scheduling.k8s.io/v1beta1"
"""Workload and PodGroup of Kubernetes' own gang scheduling (KEP-4671), served from 1.37 on."""
WORKLOAD_TEMPLATE = "workers"
"""The one podGroupTemplate of a TrainingJob's Workload, which its PodGroups name in workloadRef."""
VOLCANO_PODGROUP_API = "scheduling.volcano.sh/v1beta1"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"
COSCHEDULING_PODGROUP_API = "scheduling.x-k8s.io/v1alpha1"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
COSCHEDULING_SCHEDULER = "scheduler-plugins-scheduler"

# Kueue (kueue.x-k8s.io): TrainingJob is one of Kueue's external frameworks and the operator is its job
# controller, keeping one Workload per queued TrainingJob (see queueing.py).
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API = f"{KUEUE_GROUP}/v1beta2"
"""The Workload API version the operator writes: the storage version of Kueue 0.19."""
KUEUE_QUEUE_LABEL = f"{KUEUE_GROUP}/queue-name"
KUEUE_PRIORITY_LABEL = f"{KUEUE_GROUP}/priority-class"
"""A WorkloadPriorityClass name, as Kueue's own integrations read it from a job's labels."""
KUEUE_PODSET_LABEL = f"{KUEUE_GROUP}/podset"
KUEUE_JOB_UID_LABEL = f"{KUEUE_GROUP}/job-uid"
KUEUE_EXTERNAL_FRAMEWORK = f"{KIND}.{VERSION}.{GROUP}"
"""The name to list in Kueue's integrations.externalFrameworks."""

# The images the project builds (hack/build-images.sh, Dockerfile.operator, Dockerfile.trainer): one name
# each, everywhere (chart defaults, examples, docs); tests/examples/test_image_names.py holds them together.
IMAGE_REGISTRY = "ghcr.io/kubetrain"
OPERATOR_IMAGE = f"{IMAGE_REGISTRY}/kubetrain-operator:{__version__}"
TRAINER_IMAGE = f"{IMAGE_REGISTRY}/kubetrain-trainer:{__version__}"
"""The workers' image when spec.image is empty and the operator is given no --default-image."""
