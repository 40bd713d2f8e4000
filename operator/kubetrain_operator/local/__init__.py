"""A TrainingJob without a cluster: `kubetrain validate` and `kubetrain run --local`.

Modules, in order (each imports only those before it, `api/` and `planning/`; never `runtime/`):
- `manifests`: TrainingJob manifests read from files, refused naming the file and field;
- `processes`: the worker pods the operator would create, translated into local processes;
- `group_run`: a fixed-size group run here, restarted whole as the operator restarts it;
- `elastic_run`: an elastic group run here, one worker replaced at a time, scaled by editing the file;
- `command`: `kubetrain run --local`, which reads the manifest and runs its kind of group.
"""
