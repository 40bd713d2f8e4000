"""kubetrain's operator: the TrainingJob API and the controller that runs it under kopf.

The package's folders are its layers; a module imports only the modules listed before it in its own
folder's docstring and the folders below its own, never its own folder's face, so no import goes round
in a circle (`tests/operator/test_operator_layers.py` holds the code to this):

- `api/`: the TrainingJob API. The pydantic models (the one source of truth for the CRD), names of
  children, field paths, and the CRD and API reference generated from the models. Pure.
- `planning/`: the pure core, no I/O. Reading children, status, the failure and success policies, child
  manifests, Kueue's admission, and the planner (spec + observed children -> a plan) with one module per
  group policy (`whole_group`, `elastic_group`) over the steps they share (`steps`).
- `runtime/`: the I/O shell on a cluster. The REST client, leader election, the cache of TrainingJobs
  and their children and its watches, events, metrics, the work queue, the controller that executes
  plans, and the start under kopf.
- `local/`: the same TrainingJob without a cluster: manifests read from files, and `kubetrain run
  --local` running the workers as processes (a fixed group or an elastic one). Beside `runtime/`: neither
  imports the other.
- `remote/`: a job on a cluster seen from a user's machine: `kubetrain artifacts` copying a job's output
  directory off its claim through a short-lived pod. Over `runtime/`, whose REST client it uses.
- `cli` on top: the `kubetrain` command.

The operator imports only the torch-free parts of the trainer package (its config, contract, exit codes
and termination records): it installs and runs without torch.
"""

__version__ = "0.1.0"
