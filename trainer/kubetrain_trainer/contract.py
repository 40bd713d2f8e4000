"""Names of the environment variables and annotations shared by the operator and the trainer.

Both sides import these constants, so the contract cannot drift. See "Worker environment" in
docs/trainingjob.md.
"""

MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
WORLD_SIZE = "WORLD_SIZE"
"""Total number of training processes: workers x processes per worker (never the number of nodes)."""
RANK = "RANK"
"""Global rank of the process; for a worker with several processes torchrun sets it per process."""
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
NODE_RANK = "NODE_RANK"
"""Index of the worker (pod) in the group, 0 being the master."""

PET_NNODES = "PET_NNODES"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_NODE_RANK = "PET_NODE_RANK"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"

JOB_NAME = "KUBETRAIN_JOB_NAME"
"""Name of the TrainingJob; the trainer keys checkpoints and artifacts by it."""
JOB_UID = "KUBETRAIN_JOB_UID"
"""metadata.uid of the TrainingJob: a checkpoint resumes only the job that wrote it, never a new job
created under the same name."""
RESTART_ATTEMPT = "KUBETRAIN_RESTART_ATTEMPT"
"""0 for the first run of the group, incremented by every whole-group restart."""
TRAINER_CONFIG = "KUBETRAIN_TRAINER_CONFIG"
"""The built-in trainer's configuration as JSON (a serialised `TrainerConfig`)."""
TERMINATION_LOG = "KUBETRAIN_TERMINATION_LOG"
"""Where a failing process records its exit code and reason (`termination.ExitRecord`): the container's
terminationMessagePath, which the kubelet copies into the pod status, so the code survives launchers such
as torchrun that exit 1 for any failed child."""
TERMINATION_LOG_PATH = "/dev/termination-log"
"""The worker container's terminationMessagePath (the Kubernetes default, set explicitly)."""
POD_NAME = "KUBETRAIN_POD_NAME"
POD_NAMESPACE = "KUBETRAIN_POD_NAMESPACE"

PROGRESS_ANNOTATION = "kubetrain.io/progress"
"""Pod annotation that rank 0 keeps up to date with JSON progress; the operator copies it to status."""
PROGRESS_FILE = "progress.json"
"""File in the job's output directory holding the same JSON as the annotation."""

HEARTBEAT_ANNOTATION = "kubetrain.io/heartbeat"
"""Each worker's own liveness report on its own pod, written only when HEARTBEAT_SECONDS is set: JSON
`{"step": int, "stepAt": RFC 3339, "updatedAt": RFC 3339}`, where `stepAt` is when the worker last made
progress (an optimizer step, an evaluation batch, a checkpoint written; before the first, when the heartbeat
started, after start-up and any resume) and `step` its optimizer step count then; times to the second, in
UTC. Written by the LOCAL_RANK 0 process of each pod, at once and then every HEARTBEAT_SECONDS, from a
thread of its own, so a worker blocked in a collective keeps `updatedAt` fresh while `stepAt` ages.
The operator restarts a group in which a worker made no progress for
spec.failurePolicy.progressDeadlineSeconds (a hung collective, a frozen process), naming it."""
HEARTBEAT_SECONDS = "KUBETRAIN_HEARTBEAT_SECONDS"
"""How often, in seconds, each worker writes its heartbeat annotation; unset: no heartbeat (the operator
sets it only for jobs with a progress deadline, so other jobs cost no extra request)."""

# Elastic jobs (spec.elastic): torchrun's rendezvous settings, read by torchrun as defaults of its flags.
PET_RDZV_BACKEND = "PET_RDZV_BACKEND"
PET_RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"
PET_RDZV_ID = "PET_RDZV_ID"
PET_RDZV_CONF = "PET_RDZV_CONF"
PET_MAX_RESTARTS = "PET_MAX_RESTARTS"
PET_LOCAL_ADDR = "PET_LOCAL_ADDR"
TORCH_DISABLE_SHARE_RDZV_TCP_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""Set to 1 on elastic workers: torchrun then makes each round's rank 0 host the training store afresh.
With sharing on, a worker that keeps a non-zero rank across rounds keeps the previous round's rank-0
address, which is gone when that worker was the one lost."""
