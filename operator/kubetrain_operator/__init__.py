"""kubetrain's operator: the TrainingJob API and the kopf controller that runs it.

Layers, each importing only the ones above it:

- `constants`, `api` (the pydantic models: the one source of truth for the CRD), `names`;
- `builders` (pure child manifests), `observe` (pure reading of child objects), `failure`, `status`,
  `admission` (what the operator's flags let a spec ask for), `reconcile` (the pure planner: spec +
  observed children -> actions);
- `crdgen` (CRD YAML from the models), `metrics`;
- `handlers` (the thin kopf shell that executes plans), `main` (operator settings and start), `cli`.

Nothing here imports torch: the trainer package is imported only for its torch-free config and contract.
"""

__version__ = "0.1.0"
