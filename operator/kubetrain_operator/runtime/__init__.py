"""The I/O shell on a cluster: reads the API into the cache, runs the planner, writes what it decided.

Modules, in order (each imports only those before it, `api/` and `planning/`):
- `watchstream`: watch answers cut into lines straight from the connection;
- `connections`: keep-alive HTTP/1.1 connections to the API server, one request and answer on them;
- `kube`: the REST client, on plain dicts (authentication from the official client, raw JSON);
- `leader`: Lease election, pure decisions and the requests that act on them;
- `health`: the liveness endpoint a standby answers until kopf serves it;
- `heap`: the C allocator's free memory given back to the system once a minute;
- `cache`: TrainingJobs, their children and cluster objects as last seen, children filed by owner;
- `informer`: the watches of TrainingJobs and their children that fill the cache;
- `events`: Kubernetes Events about TrainingJobs, posted in the background;
- `metrics`: the Prometheus metrics, and the one endpoint a replica serves them on from its start;
- `workeridentity`: the workers' ServiceAccount, created where they run;
- `workqueue`: which TrainingJob is reconciled next, and when;
- `controller`: plan execution (status first, then deletions, creations and events);
- `discovery`: Kueue or a gang API installed after the start, noticed without a restart;
- `main`: the operator's settings and start.
"""
