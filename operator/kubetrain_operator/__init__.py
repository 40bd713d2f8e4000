"""kubetrain's operator: the TrainingJob API and the controller that runs it under kopf.

Modules, in order: each imports only modules listed before it (and the torch-free parts of the trainer
package: its config, contract, exit codes and termination records). `tests/operator/test_operator_layers.py`
holds the code to this order.

- The API: `constants`, `api` (the pydantic models, the one source of truth for the CRD), `names`.
- The pure core, no I/O: `fieldpaths` (a child's field path said as the TrainingJob's field), `observe`
  (reading child objects), `status`, `failure`, `gang` (which gang scheduler, and its group names),
  `builders` (child manifests), `admission` (what the operator's flags let a spec ask for), `queueing`
  (Kueue: the Workload of a queued TrainingJob and what its status means), `reconcile` (the planner:
  spec + observed children -> plan) with `membership` (its policy for elastic jobs, which builds on
  reconcile's plan types, so the two import each other), `crdgen` and `apidocs` (the CRD YAML and its
  docs, from the models: `kubetrain crds` writes both).
- The I/O shell: `kube` (the REST client), `leader` (Lease election: pure decisions and the requests
  that act on them), `cache`, `informer` (watches of the children into the cache), `events`, `metrics`,
  `manifests` (TrainingJob manifests read from files, `kubetrain validate`), `localrun` (local mode: a
  TrainingJob's workers as local processes) with `localelastic` (local mode for elastic jobs; the second
  pair that import each other), `workeridentity` (the workers' ServiceAccount, created where they run),
  `workqueue` (which TrainingJob is reconciled next, and when), `controller` (plan execution),
  `handlers` (kopf handlers that only feed the cache and the queue), `main` (settings and start) and
  `cli`.
"""

__version__ = "0.1.0"
