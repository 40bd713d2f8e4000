"""One group of W workers beside one JobSet of W replicas (issue 27), on the control plane of peers.py.

    .venv/bin/python benchmarks/peers_scale.py [--workers 1024]
        [--systems kubetrain,jobset,jobset-no-webhooks] [--phases create,restart,elastic]
        [--out benchmarks/results/peers-scale-w1024]

Each system gets what peers.py gives one round (`peers.measured_cluster`): a fresh control plane auditing
the controller's requests, with the raised controller-manager and scheduler limits; enough kwok nodes of
110 pods for two groups at once (a restarted group's new pods may exist beside the old); its controller
(`peers.Controller`); one watcher (`peers.Watch`) recording every pod's, batch Job's and job's events on
one clock. JobSet runs twice: `jobset` with its mutating and validating webhooks served with a
certificate made here and registered by URL with their caBundle (as peers.py runs it), and
`jobset-no-webhooks` with none registered; v0.12.0's manager panics on a JobSet its mutating webhook did
not default, so that JobSet carries the webhook's defaults itself (`held_jobset`).
Every pod carries `sim.kubetrain.io/hold`: kwok keeps it Running until the benchmark fails it.

Phases, one after the other in the same cluster:

1. create: one TrainingJob of W workers (runPolicy.maxRestarts 3), or one JobSet with one replicatedJob of
   W replicas (failurePolicy.maxRestarts 3) running the pod kubetrain builds for worker 0; from the POST to
   the last pod existing and to every pod Running.
2. restart: one worker fails by kwok's own `pod-fail` stage (tests/testcluster/kwok.yaml): the benchmark
   patches the pod's annotations (drops hold, sets exit-code 1 and run-for 0s), and kwok writes the pod
   Failed with exit code 1, as a kubelet reports a container that exited 1. Its Job fails (backoffLimit
   0) and each system restarts the whole group: kubetrain's whole-group restart, JobSet's failurePolicy.
   From the patch to every old batch Job deleted, every old pod deleted, and W new pods Running.
3. elastic (kubetrain alone: JobSet has no elastic mode): the fixed job is deleted and its pods waited
   out, then one elastic TrainingJob of W workers (minWorkers W/2, maxWorkers W) is created; one worker
   fails the same way, and the operator replaces that worker only. From the patch to the failed worker's
   Job deleted and its replacement Running; how many Jobs were deleted and pods created shows that no
   other worker moved.

Per phase: the controller's CPU seconds (utime + stime), its peak RSS so far (VmHWM), and its requests by
verb and resource from the API server's audit log, from the phase's start to its end (a failure's phase
ends after --settle seconds more, watched for anything else the failure moves). After each phase, the
size of the job's status (compact JSON) and of the whole object. The API server stores an object in one
etcd request, and etcd refuses a request over --max-request-bytes (1,572,864 bytes, 1.5 MiB, by default:
`etcd --help` of the v3.6.16 the test control plane runs); kube-apiserver has no flag of its own for it.
The results read the limit in force from the cluster's etcd command line (the flag if set, else the
default).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import peers
from peers import NAMESPACE, Controller, Watch, operator_scale
from testcluster.cluster import Cluster

HOLD = "sim.kubetrain.io/hold"
ETCD_DEFAULT_MAX_REQUEST_BYTES = 1572864
"""etcd's --max-request-bytes when the flag is absent (1.5 MiB): the largest object the API server can
store."""
MAX_RESTARTS = 3
PHASES = ("create", "restart", "elastic")
SYSTEMS = ("kubetrain", *peers.JOBSETS)


# ---------------------------------------------------------------- workloads


def fixed_trainingjob(name: str, workers: int) -> dict[str, Any]:
    """peers.py's TrainingJob, its pods held Running, restarted whole up to MAX_RESTARTS times."""
    body = peers.trainingjob(name, workers, "1s")
    body["spec"]["podAnnotations"][HOLD] = "true"
    body["spec"]["runPolicy"] = {"maxRestarts": MAX_RESTARTS}
    return body


def elastic_trainingjob(name: str, workers: int) -> dict[str, Any]:
    """The same job elastic: a failed worker is replaced alone (docs/elastic.md)."""
    body = fixed_trainingjob(name, workers)
    body["spec"]["elastic"] = {"minWorkers": max(1, workers // 2), "maxWorkers": workers}
    return body


def held_jobset(name: str, workers: int, webhooks: bool) -> dict[str, Any]:
    """peers.py's JobSet, its pods held Running, restarted whole by failurePolicy up to MAX_RESTARTS.

    Without webhooks it carries what JobSet's mutating webhook would have set (`peers.without_webhooks`)."""
    body = peers.jobset(name, workers, "1s")
    job = body["spec"]["replicatedJobs"][0]["template"]["spec"]
    job["template"]["metadata"]["annotations"][HOLD] = "true"
    body["spec"]["failurePolicy"] = {"maxRestarts": MAX_RESTARTS}
    return body if webhooks else peers.without_webhooks(body)


def nodes_for(workers: int) -> int:
    """kwok nodes (110 pods each) for two groups and an elastic job's store at once, and one spare."""
    return math.ceil(2 * (workers + 1) / 110) + 1


# ---------------------------------------------------------------- measuring


def alive(watch: Watch, kind: str) -> set[str]:
    """Objects of `kind` seen and not deleted."""
    return set(watch.times(kind)) - set(watch.times(kind, "Deleted"))


def fail_worker(client: operator_scale.Api, pod: str) -> None:
    """Let kwok's pod-fail stage end `pod` with exit code 1: the stage matches a Running pod without the
    hold annotation whose exit-code annotation is set, and writes it Failed after run-for."""
    patch = {
        "metadata": {
            "annotations": {HOLD: None, "sim.kubetrain.io/exit-code": "1", "sim.kubetrain.io/run-for": "0s"}
        }
    }
    response = client.pool.request(
        "PATCH",
        f"{client.server}/api/v1/namespaces/{NAMESPACE}/pods/{pod}",
        body=json.dumps(patch).encode(),
        headers={"Content-Type": "application/merge-patch+json"},
        timeout=60,
    )
    if response.status != 200:
        raise RuntimeError(f"patch {pod}: {response.status} {response.data[:300]!r}")


@dataclass
class Rig:
    """One cluster's handles a phase works with: the admin client, the watcher, the system's controller."""

    client: operator_scale.Api
    watch: Watch
    controller: Controller


class Meter:
    """A phase's controller cost: CPU, peak RSS and audited requests between `__init__` and `done`."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.cpu = controller.stats()["cpu_seconds"]
        self.requests = len(controller.requests())

    def done(self) -> dict[str, Any]:
        stats = self.controller.stats()
        rows = self.controller.requests()[self.requests :]
        return {
            "cpu_seconds": round(stats["cpu_seconds"] - self.cpu, 2),
            "peak_rss_mb": round(stats["peak_rss_mb"], 1),
            "requests": len(rows),
            "requests_by_kind": dict(Counter(f"{r['verb']} {r['resource']}" for r in rows).most_common()),
        }


def object_size(client: operator_scale.Api, path: str) -> dict[str, int]:
    """The bytes of the object's status and of the whole object, as compact JSON (what etcd stores is
    protobuf or JSON of about this size; custom resources are stored as JSON)."""
    obj = client.request("GET", path)
    compact = {"separators": (",", ":")}
    return {
        "status_bytes": len(json.dumps(obj.get("status") or {}, **compact)),
        "object_bytes": len(json.dumps(obj, **compact)),
    }


def create_phase(rig: Rig, path: str, body: dict[str, Any], pods: int) -> dict[str, Any]:
    """POST one job; the time to `pods` pods existing and to all of them Running."""
    watch = rig.watch
    meter = Meter(rig.controller)
    started = time.time()
    rig.client.create(path, body)

    def all_running() -> bool:
        return len(alive(watch, "Pod") & set(watch.times("Pod", "Running"))) >= pods

    watch.wait(all_running, 600 + pods, f"{pods} pods Running")
    created = watch.times("Pod")
    running = watch.times("Pod", "Running")
    return {
        "pods_exist_seconds": round(max(created.values()) - started, 2),
        "pods_running_seconds": round(max(running.values()) - started, 2),
        **meter.done(),
    }


def failure_phase(rig: Rig, victim: str, new_pods: int, settle: float) -> dict[str, Any]:
    """Fail `victim`; wait for `new_pods` new pods Running and, for a whole-group restart (new_pods is
    every worker), every old batch Job and pod deleted, or for a replacement (1), the victim's Job."""
    watch = rig.watch
    old_pods, old_jobs = alive(watch, "Pod"), alive(watch, "BatchJob")
    owner = rig.client.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{victim}")["metadata"]
    victim_job = "{name}/{uid}".format(**owner["ownerReferences"][0])  # the watcher's key for its Job
    meter = Meter(rig.controller)
    started = time.time()
    fail_worker(rig.client, victim)

    def finished() -> bool:
        deleted_jobs = set(watch.times("BatchJob", "Deleted"))
        if new_pods > 1:
            gone = old_jobs <= deleted_jobs and old_pods <= set(watch.times("Pod", "Deleted"))
        else:
            gone = victim_job in deleted_jobs
        return gone and len(set(watch.times("Pod", "Running")) - old_pods) >= new_pods

    watch.wait(finished, 600 + 2 * new_pods, f"{new_pods} new pods Running after {victim} failed")
    done = time.time()
    time.sleep(settle)  # anything else the failure moves shows up here
    watch.poll()
    deleted_jobs = {j: t for j, t in watch.times("BatchJob", "Deleted").items() if j in old_jobs}
    deleted_pods = {p: t for p, t in watch.times("Pod", "Deleted").items() if p in old_pods}
    fresh = {p: t for p, t in watch.times("Pod").items() if t >= started}
    running = {p: t for p, t in watch.times("Pod", "Running").items() if p in fresh}
    failed = watch.times("Pod", "Failed").get(victim)
    return {
        "victim": victim,
        "pod_failed_seconds": None if failed is None else round(failed - started, 2),
        "old_jobs_gone_seconds": round(max(deleted_jobs.values()) - started, 2),
        "old_pods_gone_seconds": round(max(deleted_pods.values()) - started, 2) if deleted_pods else None,
        "new_pods_exist_seconds": round(max(fresh.values()) - started, 2),
        "new_pods_running_seconds": round(max(running.values()) - started, 2),
        "done_seconds": round(done - started, 2),
        "old_jobs_deleted": len(deleted_jobs),
        "old_pods_deleted": len(deleted_pods),
        "new_pods_created": len(fresh),
        **meter.done(),
    }


# ---------------------------------------------------------------- one system


def run_system(system: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every phase of `args.phases` that applies to `system`, in one fresh cluster."""
    w = args.workers
    kind = peers.kind_of(system)
    webhooks = system == "jobset"
    with peers.measured_cluster(kind, workdir, system, nodes_for(w), webhooks=webhooks, batch_jobs=True) as (
        cluster,
        controller,
        watch,
    ):
        client = operator_scale.Api(cluster.kubeconfig, maxsize=4)
        rig = Rig(client, watch, controller)
        jobs = peers.jobs_path(kind)
        name = "big"
        body = fixed_trainingjob(name, w) if kind == "kubetrain" else held_jobset(name, w, webhooks)
        out: dict[str, Any] = {"system": system, "control_plane": control_plane(cluster)}
        if "create" in args.phases:
            out["create"] = create_phase(rig, jobs, body, w)
            time.sleep(args.settle)  # the status the controller writes once every pod runs
            out["create"]["size"] = object_size(client, f"{jobs}/{name}")
            print(f"  {system} create: {brief(out['create'])}", flush=True)
        if "restart" in args.phases:
            victim = sorted(alive(watch, "Pod"))[w // 2]
            out["restart"] = failure_phase(rig, victim, w, args.settle)
            out["restart"]["size"] = object_size(client, f"{jobs}/{name}")
            print(f"  {system} restart: {brief(out['restart'])}", flush=True)
        if "elastic" in args.phases and kind == "kubetrain":
            if name in alive(watch, "Job"):
                client.request("DELETE", f"{jobs}/{name}", {"propagationPolicy": "Background"})
                watch.wait(lambda: not alive(watch, "Pod"), 600 + w, "the fixed job's pods deleted")
            name = "elastic"
            out["elastic_create"] = create_phase(rig, jobs, elastic_trainingjob(name, w), w + 1)
            print(f"  {system} elastic create: {brief(out['elastic_create'])}", flush=True)
            workers = sorted(p for p in alive(watch, "Pod") if "-rdzv" not in p)
            out["elastic_replace"] = failure_phase(rig, workers[w // 2], 1, args.settle)
            out["elastic_replace"]["size"] = object_size(client, f"{jobs}/{name}")
            print(f"  {system} elastic replace: {brief(out['elastic_replace'])}", flush=True)
        out["watch_errors"] = watch.errors[:10]
        return out


def control_plane(cluster: Cluster) -> dict[str, Any]:
    """etcd's request size limit as this cluster runs it: its --max-request-bytes, else etcd's default."""
    etcd = [a for a in cluster.argv["etcd"] if a.startswith("--max-request-bytes")]
    return {
        "etcd_max_request_bytes": int(etcd[0].split("=")[1]) if etcd else ETCD_DEFAULT_MAX_REQUEST_BYTES,
        "etcd_max_request_bytes_from": "flag" if etcd else "etcd default (no --max-request-bytes)",
    }


def brief(phase: dict[str, Any]) -> str:
    """A phase's figures on one line: the times, then the controller's cost."""
    skip = {"requests_by_kind", "victim"}
    return ", ".join(f"{k} {v}" for k, v in phase.items() if k not in skip)


# ---------------------------------------------------------------- report

ROWS = (
    ("create", "pods_exist_seconds", "create -> all pods exist, s"),
    ("create", "pods_running_seconds", "create -> all pods Running, s"),
    ("restart", "old_jobs_gone_seconds", "restart: failure -> old Jobs gone, s"),
    ("restart", "old_pods_gone_seconds", "restart: failure -> old pods gone, s"),
    ("restart", "new_pods_running_seconds", "restart: failure -> new pods all Running, s"),
    ("restart", "done_seconds", "restart: failure -> all of these (done), s"),
    ("elastic_create", "pods_running_seconds", "elastic: create -> all pods Running (store too), s"),
    ("elastic_replace", "old_jobs_gone_seconds", "elastic: failure -> failed worker's Job gone, s"),
    ("elastic_replace", "new_pods_running_seconds", "elastic: failure -> replacement Running, s"),
)
COSTS = (("cpu_seconds", "CPU s"), ("peak_rss_mb", "peak RSS MB"), ("requests", "requests"))


def cell(run: dict[str, Any], phase: str, key: str) -> str:
    value = run.get(phase, {}).get(key)
    return "-" if value is None else f"{value:g}"


def render_markdown(results: dict[str, Any]) -> str:
    m, a = results["machine"], results["args"]
    systems = list(results["runs"])
    lines = [
        f"One job of W = {a['workers']} workers per system, {nodes_for(int(a['workers']))} kwok nodes; "
        f"JobSet {results['jobset_version']} (`jobset`: its webhooks registered; `jobset-no-webhooks`: "
        "none). "
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory']}, load average at start "
        f"{' '.join(m['loadavg_at_start'])}; kube-apiserver {m['kube_apiserver']}; Python {m['python']}. "
        f"{m['note']}",
        "",
        "| | " + " | ".join(systems) + " |",
        "|---" * (len(systems) + 1) + "|",
    ]
    for phase, key, label in ROWS:
        lines.append(
            f"| {label} | " + " | ".join(cell(results["runs"][s], phase, key) for s in systems) + " |"
        )
    for phase in ("create", "restart", "elastic_create", "elastic_replace"):
        for key, label in COSTS:
            row = [cell(results["runs"][s], phase, key) for s in systems]
            if any(c != "-" for c in row):
                lines.append(f"| {phase}: {label} | " + " | ".join(row) + " |")
    lines.append("")
    for system, run in results["runs"].items():
        limit = run["control_plane"]["etcd_max_request_bytes"]
        for phase in ("create", "restart", "elastic_replace"):
            if "size" in run.get(phase, {}):
                size = run[phase]["size"]
                lines.append(
                    f"- {system} after {phase}: status {size['status_bytes']:,} B, object "
                    f"{size['object_bytes']:,} B ({size['object_bytes'] / limit:.1%} of etcd's {limit:,} B, "
                    f"{run['control_plane']['etcd_max_request_bytes_from']})"
                )
        for phase in ("restart", "elastic_replace"):
            if phase in run:
                p = run[phase]
                lines.append(
                    f"- {system} {phase}: failed {p['victim']}; {p['old_jobs_deleted']} old Jobs and "
                    f"{p['old_pods_deleted']} old pods deleted, {p['new_pods_created']} new pods; requests "
                    + ", ".join(f"{k} {v}" for k, v in p["requests_by_kind"].items())
                )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1024)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument(
        "--settle", type=float, default=5.0, help="seconds watched after a failure is handled"
    )
    parser.add_argument("--machine-note", default="", help="what else ran on the machine meanwhile")
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/peers-scale-w<W>")
    args = parser.parse_args(argv)
    args.phases = args.phases.split(",")
    systems = args.systems.split(",")
    out = args.out or peers.REPO / "benchmarks" / "results" / f"peers-scale-w{args.workers}"
    workdir = Path(tempfile.mkdtemp(prefix="kubetrain-peers-scale-"))
    if any(s != "kubetrain" for s in systems):
        peers.jobset_dir()  # build before the first cluster, not inside it
    results: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "jobset_version": os.environ.get("JOBSET_VERSION", "v0.12.0"),
        "machine": peers.machine(args),
        "runs": {},
    }
    for system in systems:
        print(f"{system}:", flush=True)
        results["runs"][system] = run_system(system, args, workdir)
        peers.write_results(out, results, render_markdown)
    print(f"wrote {out}.json and .generated.md (workdir {workdir})")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the cluster
    sys.exit(main())
