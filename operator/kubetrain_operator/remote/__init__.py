"""A TrainingJob on a cluster, seen from a user's machine: `kubetrain artifacts` copies a job's output
directory off its volume.

Modules, in order (each imports only those before it, `api/`, `planning/` and `runtime/`'s REST client):
- `outputs`: pure: where the built-in trainer's artifacts lie on the job's volume (or why kubetrain cannot
  tell, naming the field), and the short-lived pod that reads them out;
- `copying`: the copy itself: the pod created, a tar streamed out through the API's exec, unpacked into
  the user's directory, and the pod deleted whatever happened.
"""
