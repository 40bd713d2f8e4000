"""Why kubetrain's pods wait between being bound and Running (issue 15): the same pods made several ways,
each on a fresh control plane, side by side in one run.

    .venv/bin/python benchmarks/pod_wait.py [--n 50] [--workers 4] [--rounds 2]
        [--variants direct-plain,direct-kubetrain,operator,operator-no-status,operator-no-pod-watch,jobset]
        [--out benchmarks/results/pod-wait]

Variants (each makes N groups of W single-pod Jobs whose pod template is the one kubetrain builds):

- direct-plain: the script creates the W Jobs of each group with the Job body peers.py gives JobSet
  (no hostname, no subdomain, no Service, no owner): the floor, no controller at all;
- direct-kubetrain: the script creates exactly what the operator creates (the headless Service and the W
  Jobs of `builders`, owner references dropped): kubetrain's objects without kubetrain's operator;
- direct-kubetrain-no-service: the same without the Service;
- direct-kubetrain-no-hostname: the same with the Service, the pods without hostname and subdomain;
- direct-kubetrain-paced: direct-kubetrain's objects, one group every --pace seconds (the pace at which
  JobSet's manager and webhooks let pods exist on this machine) instead of all at once;
- direct-kubetrain-kwok8, direct-kubetrain-kwok32: direct-kubetrain's objects, kwok writing pod statuses
  with 8 or 32 workers (podPlayStageParallelism; tests/testcluster/kwok.yaml had 8, has 32);
- operator: TrainingJobs, through `kubetrain operator` as shipped;
- operator-no-status: the same operator, its status patches replaced by a read of the object (an
  experiment switch of this script only: the operator plans from the status it would have written);
- operator-no-pod-watch: the same operator without its pod informer;
- jobset: JobSets through JobSet's manager and webhooks (peers.py).

The cluster is peers.py's (audit log of the controller's requests, the raised component client limits,
`--nodes` kwok nodes). Per pod, one watcher subprocess records when it was created, bound (a nodeName,
still Pending) and Running. Per variant: created -> bound and bound -> Running percentiles, the last pod
existing -> the last one Running, every control-plane component's CPU seconds over the run (from /proc),
and the controller's requests per group (audit log).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

import operator_scale  # noqa: E402
import peers  # noqa: E402
from kubetrain_operator import api  # noqa: E402
from kubetrain_operator.api import constants  # noqa: E402
from kubetrain_operator.planning import builders  # noqa: E402
from testcluster import cluster as cluster_module  # noqa: E402
from testcluster.cluster import Cluster  # noqa: E402
from testcluster.operator_process import install_crd  # noqa: E402

NAMESPACE = peers.NAMESPACE
VARIANTS = (
    "direct-plain",
    "direct-kubetrain",
    "direct-kubetrain-no-service",
    "direct-kubetrain-no-hostname",
    "direct-kubetrain-paced",
    "direct-kubetrain-kwok8",
    "direct-kubetrain-kwok32",
    "operator",
    "operator-no-status",
    "operator-no-pod-watch",
    "jobset",
)
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["ResponseStarted", "Panic"],
    "rules": [
        # The controller's requests, once each (as peers.py counts them) ...
        {"level": "Metadata", "users": [peers.CONTROLLER_USER], "omitStages": ["ResponseComplete"]},
        # ... and every write to a pod's status, received and answered: kwok's "Running" is one of them.
        {
            "level": "Metadata",
            "verbs": ["patch", "update"],
            "resources": [{"group": "", "resources": ["pods/status"]}],
        },
        {"level": "None"},
    ],
}
"""peers.py's policy, plus the pod status writes (both stages): when kwok sent each and how long the API
server took to answer it."""
KWOK_WORKERS = {"direct-kubetrain-kwok8": 8, "direct-kubetrain-kwok32": 32}
"""kwok's podPlayStageParallelism where a variant sets it; the others run with kwok.yaml's."""
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def direct_objects(variant: str, n: int, workers: int, run_for: str) -> list[tuple[str, dict[str, Any]]]:
    """(kind, manifest) of every object the script itself creates for a direct-* variant."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        name = f"j-{i:05d}"
        if variant == "direct-plain":
            template = peers.jobset(name, workers, run_for)["spec"]["replicatedJobs"][0]["template"]
            for w in range(workers):
                job = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": f"{name}-w-{w}", "labels": {"group": name}},
                    "spec": json.loads(json.dumps(template["spec"])),
                }
                out.append(("Job", job))
            continue
        body = peers.trainingjob(name, workers, run_for)
        spec = api.TrainingJobSpec.model_validate(body["spec"])
        ctx = builders.Context(owner=builders.Owner(name, NAMESPACE, f"direct-{i}"), spec=spec)
        if variant != "direct-kubetrain-no-service":  # paced, kwok*: the same objects as direct-kubetrain
            service = builders.build_service(ctx)
            service["metadata"].pop("ownerReferences")
            out.append(("Service", service))
        for job in builders.build_worker_jobs(ctx):
            job["metadata"].pop("ownerReferences")
            if variant == "direct-kubetrain-no-hostname":
                del job["spec"]["template"]["spec"]["hostname"], job["spec"]["template"]["spec"]["subdomain"]
            out.append(("Job", job))
    return out


class Operator:
    """`kubetrain operator` as peers:controller, with this script's experiment switch (`operator_main`)."""

    def __init__(self, variant: str, cluster: Cluster, kubeconfig: Path, workdir: Path, tag: str) -> None:
        self.log = workdir / f"{tag}.log"
        self.audit = cluster.directory / "audit.log"
        argv = [sys.executable, __file__, "_operator", variant, "operator", "--namespace", NAMESPACE]
        argv += ["--metrics-port", "0", "--liveness", ""]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + 300
        while not any(r["verb"] == "watch" and r["resource"] == constants.PLURAL for r in self.requests()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"operator did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.3)
        time.sleep(2.0)

    def requests(self) -> list[dict[str, str]]:
        return peers.Controller.requests(self)  # type: ignore[arg-type]

    def stats(self) -> dict[str, float]:
        return operator_scale.proc_stats(self.process.pid)

    def stop(self) -> None:
        peers.Controller.stop(self)  # type: ignore[arg-type]


def operator_main(variant: str, argv: list[str]) -> int:
    """The operator, with one part switched off for an experiment (never in the shipped operator)."""
    from kubetrain_operator import cli
    from kubetrain_operator.runtime import informer, kube

    if variant == "operator-no-status":

        def read_instead(
            self: kube.Kube, namespace: str, name: str, status: dict[str, Any], resource_version: str | None
        ) -> dict[str, Any]:
            current = self.request("GET", kube.path(constants.KIND, namespace, name))
            return {**current, "status": {**(current.get("status") or {}), **status}}

        kube.Kube.patch_status = read_instead  # type: ignore[method-assign]
    elif variant == "operator-no-pod-watch":
        shipped = informer.informers

        def without_pods(*args: Any, **kwargs: Any) -> list[informer.Informer]:
            return [each for each in shipped(*args, **kwargs) if each.kind != "Pod"]

        informer.informers = without_pods  # type: ignore[assignment]
    return cli.main(argv)


def component_cpu(cluster: Cluster) -> dict[str, float]:
    out = {}
    for name in COMPONENTS:
        with contextlib.suppress(OSError, KeyError):
            out[name] = operator_scale.proc_stats(cluster.pids[name])["cpu_seconds"]
    return out


def cluster_for(workdir: Path, kwok_workers: int | None = None) -> Cluster:
    """peers.py's cluster, auditing pod status writes too; `kwok_workers` overrides kwok's
    podPlayStageParallelism."""
    saved = peers.AUDIT_POLICY, cluster_module.KWOK_CONFIG
    peers.AUDIT_POLICY = AUDIT_POLICY
    if kwok_workers is not None:
        documents = list(yaml.safe_load_all(saved[1].read_text()))
        documents[0]["options"]["podPlayStageParallelism"] = kwok_workers
        cluster_module.KWOK_CONFIG = workdir / f"kwok-{kwok_workers}.yaml"
        cluster_module.KWOK_CONFIG.write_text(yaml.safe_dump_all(documents))
    try:
        return peers.cluster_for(workdir)
    finally:
        peers.AUDIT_POLICY, cluster_module.KWOK_CONFIG = saved


def status_writes(audit: Path, bound: dict[str, float]) -> dict[str, Any]:
    """From the audit log: bound -> the first pod status write received (kwok's own delay), and how long
    the API server took to answer each (received -> answered)."""
    received: dict[str, float] = {}
    answered: dict[str, float] = {}
    latencies: list[float] = []
    opened: dict[str, float] = {}
    with audit.open() as f:
        for line in f:
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            if ref.get("resource") != "pods" or ref.get("subresource") != "status":
                continue
            at = datetime.datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")).timestamp()
            if event["stage"] == "RequestReceived":
                opened[event["auditID"]] = at
                received.setdefault(ref["name"], at)
            elif event["stage"] == "ResponseComplete" and event["auditID"] in opened:
                latencies.append(at - opened[event["auditID"]])
                answered.setdefault(ref["name"], at)
    return {
        "bound_to_status_write_received_seconds": operator_scale.percentiles(
            [received[p] - bound[p] for p in received if p in bound]
        ),
        "status_write_latency_seconds": operator_scale.percentiles(latencies),
    }


def run_variant(variant: str, args: argparse.Namespace, workdir: Path, tag: str) -> dict[str, Any]:
    n, w = args.n, args.workers
    cluster = cluster_for(workdir, KWOK_WORKERS.get(variant))
    watch = controller = None
    try:
        cluster.add_nodes(args.nodes, prefix="bench")
        kubeconfig = peers.controller_kubeconfig(cluster)
        system = "jobset" if variant == "jobset" else "kubetrain"
        if variant == "jobset":
            controller = peers.Controller("jobset", cluster, kubeconfig, workdir, tag)
        else:
            install_crd(cluster)
            if variant.startswith("operator"):
                controller = Operator(variant, cluster, kubeconfig, workdir, tag)
        watch = peers.Watch(cluster, system, workdir / f"{tag}.tsv")
        client = operator_scale.Api(cluster.kubeconfig, maxsize=args.threads)
        cpu_before = component_cpu(cluster)
        controller_before = controller.stats() if controller else {"cpu_seconds": 0.0}
        baseline = len(controller.requests()) if controller else 0
        started = time.time()
        if variant == "direct-kubetrain-paced":
            objects = direct_objects(variant, n, w, args.run_for)
            per_group = len(objects) // n
            for start in range(0, len(objects), per_group):
                operator_scale.create_all(client, NAMESPACE, objects[start : start + per_group], args.threads)
                time.sleep(max(0.0, started + (start // per_group + 1) * args.pace - time.time()))
            submit = time.time() - started
        elif variant.startswith("direct"):
            objects = direct_objects(variant, n, w, args.run_for)
            submit = operator_scale.create_all(client, NAMESPACE, objects, args.threads)
        elif variant == "jobset":
            bodies = [peers.jobset(f"j-{i:05d}", w, args.run_for) for i in range(n)]
            path = f"{peers.JOBSET_API}/namespaces/{NAMESPACE}/jobsets"
            submit = peers.create_all(client, path, bodies, args.threads)
        else:
            bodies = [peers.trainingjob(f"j-{i:05d}", w, args.run_for) for i in range(n)]
            path = f"{peers.TJ_API}/namespaces/{NAMESPACE}/{constants.PLURAL}"
            submit = peers.create_all(client, path, bodies, args.threads)
        watch.wait(lambda: watch.count("Pod", "Succeeded") >= n * w, 1800, f"{n * w} pods succeeded")
        cpu_after = component_cpu(cluster)
        pods, bound, running = watch.times("Pod"), watch.times("Pod", "Bound"), watch.times("Pod", "Running")
        succeeded = watch.times("Pod", "Succeeded")
        out: dict[str, Any] = {
            "variant": variant,
            "submit_seconds": submit,
            "pods_exist_seconds": max(pods.values()) - started,
            "pods_created_over_seconds": max(pods.values()) - min(pods.values()),
            "pods_running_seconds": max(running.values()) - started,
            "pods_succeeded_seconds": max(succeeded.values()) - started,
            "last_pod_exists_to_last_running_seconds": max(running.values()) - max(pods.values()),
            "created_to_bound_seconds": operator_scale.percentiles([bound[p] - pods[p] for p in bound]),
            "bound_to_running_seconds": operator_scale.percentiles(
                [running[p] - bound[p] for p in running if p in bound]
            ),
            "running_to_succeeded_seconds": operator_scale.percentiles(
                [succeeded[p] - running[p] for p in succeeded if p in running]
            ),
            **status_writes(cluster.directory / "audit.log", bound),
            "component_cpu_seconds": {
                name: round(cpu_after[name] - cpu_before.get(name, 0.0), 2) for name in cpu_after
            },
            "watch_errors": watch.errors[:10],
        }
        if controller is not None:
            rows = controller.requests()[baseline:]
            kinds = Counter(f"{r['verb']} {r['resource']}" for r in rows)
            cpu = controller.stats()["cpu_seconds"] - controller_before["cpu_seconds"]
            out["controller_cpu_seconds"] = cpu
            out["controller_requests_per_group"] = {k: round(c / n, 2) for k, c in kinds.most_common()}
        b2r = out["bound_to_running_seconds"]
        kwok, latency = out["bound_to_status_write_received_seconds"], out["status_write_latency_seconds"]
        print(
            f"  {variant}: submit {submit:.1f}s; bound -> kwok's write received p50/p95 {kwok['p50']:.2f}/"
            f"{kwok['p95']:.2f}s, answered in p50/p95 {latency['p50']:.3f}/{latency['p95']:.3f}s; "
            f"pods created over {out['pods_created_over_seconds']:.1f}s, all Succeeded "
            f"{out['pods_succeeded_seconds']:.1f}s; last pod exists -> Running "
            f"{out['last_pod_exists_to_last_running_seconds']:.1f}s; bound -> Running p50/p95/max "
            f"{b2r['p50']:.2f}/{b2r['p95']:.2f}/{b2r['max']:.2f}s; created -> bound p50 "
            f"{out['created_to_bound_seconds']['p50']:.2f}s; CPU {out['component_cpu_seconds']} controller "
            f"{out.get('controller_cpu_seconds', 0):.1f}s",
            flush=True,
        )
        return out
    finally:
        if watch is not None:
            watch.stop()
        if controller is not None:
            controller.stop()
        with contextlib.suppress(OSError):  # the component logs outlive the cluster, for reading
            shutil.copytree(cluster.log_dir, workdir / f"{tag}-logs")
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=24)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--run-for", default="2s")
    parser.add_argument("--pace", type=float, default=5.0, help="seconds per group, direct-kubetrain-paced")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "pod-wait")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}")
    workdir = Path(tempfile.mkdtemp(prefix="kubetrain-podwait-"))
    results: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": operator_scale.host(),
        "rounds": [],
    }
    for index in range(args.rounds):
        order = variants if index % 2 == 0 else variants[::-1]
        print(f"round {index}: {', '.join(order)} (load {os.getloadavg()[0]:.1f})", flush=True)
        runs = {}
        for variant in order:
            runs[variant] = run_variant(variant, args, workdir, f"r{index}-{variant}")
            runs[variant]["loadavg_after"] = round(os.getloadavg()[0], 2)
        results["rounds"].append(runs)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out.with_suffix('.json')} (workdir {workdir})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_operator":
        sys.exit(operator_main(sys.argv[2], sys.argv[3:]))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
