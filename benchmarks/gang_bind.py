"""Gang scheduling on kwok nodes: submission -> every worker bound, and the operator's requests per job.

    PYTHONPATH=operator:trainer .venv/bin/python benchmarks/gang_bind.py [--sizes 4,16,64] [--repeats 3]
        [--jobs 10] [--nodes 8] [--baseline-src /path/to/other/checkout] [--out benchmarks/results/gang-bind]

Results: OUT.json (everything) and OUT.generated.md (tables); benchmarks/results/gang-bind.md explains them.

1. Bind latency. For each size W in --sizes, --repeats times, one TrainingJob of W workers is submitted
   (workers held running, see tests/testcluster/kwok.yaml) and a pod watch opened beforehand records when
   each worker's pod is first seen with a node. Figures: submission (right before the POST) -> all W pods
   exist (the operator's and the Job controller's part) and -> all W bound (adds the scheduler's part).
   The job is then deleted and its pods waited for before the next. Three variants:
   - `plain, gate off`: a cluster as Kubernetes 1.37 ships (GenericWorkload off), no gangScheduling;
   - `plain, gate on`: GenericWorkload on (scheduler's GangScheduling plugin loaded), no gangScheduling;
   - `kubernetes gang`: GenericWorkload on, gangScheduling.provider kubernetes (Workload + PodGroup).
2. Requests per TrainingJob, per integration (none, kubernetes, volcano, scheduler-plugins), on the
   gate-on cluster: a fresh operator process (benchmarks/operator_instrumented.py counts every request it
   makes) per integration; --jobs TrainingJobs of 2 workers (run for 1 s) submitted together and run to
   Succeeded; requests after its start-up listing are divided by the number of jobs. Volcano and
   scheduler-plugins get their PodGroup kinds installed as bare CRDs and `schedulerName: default-scheduler`
   so that the default scheduler runs the pods: the operator's side of those integrations is measured, not
   their schedulers. With --baseline-src, the same is measured for the operator of that checkout (to
   compare with the code before a change).

Everything (control plane, kwok, operator, this client) shares the machine's CPUs; on 2 shared cores the
absolute times carry that contention: compare variants within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import urllib3

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from kubetrain_operator.api import constants  # noqa: E402
from operator_scale import TJ_PATH, Api, Operator, machine  # noqa: E402
from testcluster.cluster import Cluster, start_cluster  # noqa: E402
from testcluster.manifests import bare_podgroup_crd, trainingjob  # noqa: E402
from testcluster.operator_process import install_crd  # noqa: E402

GANG_APIS = {
    "volcano": ("scheduling.volcano.sh", "v1beta1"),
    "scheduler-plugins": ("scheduling.x-k8s.io", "v1alpha1"),
}
"""PodGroup kinds installed as bare CRDs, so that the operator's side of those integrations can run."""

GANG_RESOURCES = ("workloads", "podgroups")


class PodWatch:
    """One namespace's pod watch in a thread: when each TrainingJob's pods were first seen, first seen
    bound to a node, and whether they are gone. The API server closes a watch whose reader falls behind
    (this one shares 2 loaded cores): it is opened again from the last version seen, or from a fresh
    listing when that version is too old (`reopened` counts both)."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.lock = threading.Lock()
        self.created: dict[str, dict[str, float]] = {}
        self.bound: dict[str, dict[str, float]] = {}
        self.alive: dict[str, set[str]] = {}
        self.reopened = 0
        self.stopping = False
        self.response: Any = None
        self.version = self._list()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _list(self) -> str:
        listing = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/pods")
        now = time.monotonic()
        with self.lock:
            self.alive = {}  # deletions missed while no watch was open
        for pod in listing["items"]:
            self._record({"type": "ADDED", "object": pod}, now)
        return listing["metadata"]["resourceVersion"]

    def _run(self) -> None:
        while not self.stopping:
            query = f"watch=true&resourceVersion={self.version}&timeoutSeconds=3600"
            try:
                self.response = self.api.pool.request(
                    "GET",
                    f"{self.api.server}/api/v1/namespaces/{self.namespace}/pods?{query}",
                    headers={"Accept": "application/json"},
                    preload_content=False,
                    timeout=urllib3.Timeout(connect=10, read=None),
                )
                for line in self.response:
                    if line.strip():
                        event = json.loads(line)
                        if event["type"] == "ERROR":  # 410 Gone: the version is too old
                            self.version = self._list()
                            break
                        self._record(event, time.monotonic())
                        self.version = event["object"]["metadata"]["resourceVersion"]
            except Exception:  # a broken stream: open it again, unless stopping
                if self.stopping:
                    return
            self.reopened += 1

    def _record(self, event: dict[str, Any], now: float) -> None:
        pod = event["object"]
        job = (pod["metadata"].get("labels") or {}).get(constants.LABEL_JOB_NAME)
        if job is None:
            return
        name = pod["metadata"]["name"]
        with self.lock:
            if event["type"] == "DELETED":
                self.alive.setdefault(job, set()).discard(name)
                return
            self.alive.setdefault(job, set()).add(name)
            self.created.setdefault(job, {}).setdefault(name, now)
            if pod["spec"].get("nodeName"):
                self.bound.setdefault(job, {}).setdefault(name, now)

    def times(self, job: str) -> tuple[list[float], list[float]]:
        with self.lock:
            return list(self.created.get(job, {}).values()), list(self.bound.get(job, {}).values())

    def pods_alive(self, job: str) -> int:
        with self.lock:
            return len(self.alive.get(job, ()))

    def stop(self) -> None:
        """Interrupt the thread's blocking read (closing alone would wait for it)."""
        self.stopping = True
        with contextlib.suppress(RuntimeError):  # the stream had ended already
            self.response.shutdown()
        self.thread.join(timeout=10)


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def create_namespace(api: Api, name: str) -> None:
    api.request(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    wait(
        lambda: bool(api.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts")["items"]),
        30,
        f"namespace {name}'s default ServiceAccount",
    )


def bind_latency(
    api: Api, namespace: str, variant: str, *, sizes: list[int], repeats: int, gang: dict[str, str] | None
) -> list[dict[str, Any]]:
    """Submission -> all pods exist -> all pods bound, per size and repeat."""
    watch = PodWatch(api, namespace)
    rows = []
    try:
        for size in sizes:
            for repeat in range(repeats):
                name = f"{variant}-{size}-{repeat}"
                spec: dict[str, Any] = {"gangScheduling": gang} if gang is not None else {}
                manifest = trainingjob(
                    name, workers=size, annotations={"sim.kubetrain.io/hold": "true"}, **spec
                )
                manifest["metadata"]["namespace"] = namespace
                submitted = time.monotonic()
                api.create(f"{TJ_PATH}/namespaces/{namespace}/{constants.PLURAL}", manifest)
                wait(lambda n=name, s=size: len(watch.times(n)[1]) == s, 600, f"{name}: {size} bound")
                created, bound = watch.times(name)
                row = {
                    "variant": variant,
                    "workers": size,
                    "repeat": repeat,
                    "all_created_seconds": round(max(created) - submitted, 3),
                    "all_bound_seconds": round(max(bound) - submitted, 3),
                }
                row["watch_reopened_so_far"] = watch.reopened
                rows.append(row)
                print(f"  {variant} W={size} #{repeat}: {row['all_bound_seconds']:.2f} s", flush=True)
                path = f"{TJ_PATH}/namespaces/{namespace}/{constants.PLURAL}/{name}"
                api.request("DELETE", path, {"propagationPolicy": "Foreground"})
                wait(lambda n=name: watch.pods_alive(n) == 0, 300, f"{name}'s pods gone")
    finally:
        watch.stop()
    return rows


def install_gang_crds(cluster: Cluster) -> None:
    """Bare PodGroup CRDs for Volcano and scheduler-plugins: any object is stored, nothing acts on it."""
    crds = [bare_podgroup_crd(group, version) for group, version in GANG_APIS.values()]
    cluster.apply(crds)
    cluster.kubectl(
        "wait", "--for=condition=Established", *(f"crd/podgroups.{g}" for g, _ in GANG_APIS.values())
    )


def _delta(after: list[dict[str, Any]], before: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    out: Counter[tuple[str, str]] = Counter()
    for rows, sign in ((after, 1), (before, -1)):
        for row in rows:
            if row["verb"] != "tls-connect":
                out[(row["verb"], row["resource"])] += sign * row["count"]
    return +out


def requests_per_job(
    cluster: Cluster, api: Api, integration: str, *, jobs: int, workdir: Path, env: dict[str, str], tag: str
) -> dict[str, Any]:
    """The operator's requests for `jobs` 2-worker TrainingJobs run to Succeeded, after its start-up."""
    namespace = f"req-{tag}"
    create_namespace(api, namespace)
    operator = Operator(cluster, workdir, tag, ["--namespace", namespace], False, env)
    try:
        time.sleep(2.0)  # start-up listings and watches are in; what follows is the jobs'
        before = operator.counts_now()
        spec: dict[str, Any] = {}
        if integration != "none":
            spec["gangScheduling"] = {"provider": integration}
        if integration in GANG_APIS:
            spec["schedulerName"] = "default-scheduler"  # no Volcano or scheduler-plugins scheduler here
        for index in range(jobs):
            manifest = trainingjob(
                f"job-{index}", workers=2, annotations={"sim.kubetrain.io/run-for": "1s"}, **spec
            )
            manifest["metadata"]["namespace"] = namespace
            api.create(f"{TJ_PATH}/namespaces/{namespace}/{constants.PLURAL}", manifest)

        def all_succeeded() -> bool:
            items = api.request("GET", f"{TJ_PATH}/namespaces/{namespace}/{constants.PLURAL}")["items"]
            return sum((i.get("status") or {}).get("phase") == "Succeeded" for i in items) == jobs

        wait(all_succeeded, 300, f"{jobs} {integration} TrainingJobs Succeeded")
        time.sleep(5.0)  # the last status writes and events
        delta = _delta(operator.counts_now(), before)
    finally:
        operator.stop()
    total = sum(delta.values())
    gang = {f"{verb} {res}": n / jobs for (verb, res), n in sorted(delta.items()) if res in GANG_RESOURCES}
    return {
        "integration": integration,
        "operator": tag,
        "jobs": jobs,
        "per_trainingjob": round(total / jobs, 2),
        "gang_objects_per_trainingjob": gang,
        "detail_per_trainingjob": {f"{v} {r}": round(n / jobs, 2) for (v, r), n in sorted(delta.items())},
    }


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        for size in dict.fromkeys(r["workers"] for r in rows):
            picked = [r for r in rows if r["variant"] == variant and r["workers"] == size]
            if not picked:
                continue
            bound = [r["all_bound_seconds"] for r in picked]
            created = [r["all_created_seconds"] for r in picked]
            out.append({
                "variant": variant,
                "workers": size,
                "all_bound_median_seconds": round(statistics.median(bound), 3),
                "all_bound_min_seconds": min(bound),
                "all_bound_max_seconds": max(bound),
                "all_created_median_seconds": round(statistics.median(created), 3),
            })  # fmt: skip
    return out


def render_markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory']} memory, load average at start "
        f"{' '.join(m['loadavg_at_start'])}; kube-apiserver {m['kube_apiserver']}, {m['kwok_nodes']} kwok "
        f"nodes; Python {m['python']}. Repeats per cell: {results['args']['repeats']}.",
        "",
        "Submission -> every worker bound (median, min-max), and -> every worker's pod exists (median):",
        "",
        "| workers | variant | all bound | min-max | all pods exist |",
        "|---|---|---|---|---|",
    ]
    for row in sorted(results["bind_summary"], key=lambda r: (r["workers"], r["variant"])):
        lines.append(
            f"| {row['workers']} | {row['variant']} | {row['all_bound_median_seconds']:.2f} s | "
            f"{row['all_bound_min_seconds']:.2f}-{row['all_bound_max_seconds']:.2f} s | "
            f"{row['all_created_median_seconds']:.2f} s |"
        )
    lines += [
        "",
        f"The operator's requests per TrainingJob ({results['args']['jobs']} jobs of 2 workers run to "
        "Succeeded), and those on the gang objects:",
        "",
        "| operator | integration | requests / TrainingJob | extra vs none | on gang objects / TrainingJob |",
        "|---|---|---|---|---|",
    ]
    for row in results["requests"]:
        none = next(
            r for r in results["requests"] if r["operator"].split("-")[0] == row["operator"].split("-")[0]
            and r["integration"] == "none"
        )  # fmt: skip
        gang = ", ".join(f"{k} {v:g}" for k, v in row["gang_objects_per_trainingjob"].items()) or "-"
        lines.append(
            f"| {row['operator'].split('-')[0]} | {row['integration']} | {row['per_trainingjob']:g} | "
            f"{row['per_trainingjob'] - none['per_trainingjob']:+.2f} | {gang} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4,16,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument(
        "--baseline-src", type=Path, default=None, help="a checkout whose operator to compare"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "gang-bind")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    workdir = args.workdir or Path(f"/tmp/kubetrain-gang-bench-{os.getpid()}")
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "bind": [], "requests": []}

    for gate in (False, True):
        print(
            f"cluster with GenericWorkload {'on' if gate else 'off'}, {args.nodes} kwok nodes ...", flush=True
        )
        cluster = start_cluster(nodes=0, workload_api=gate)
        try:
            cluster.add_nodes(args.nodes, prefix="bench")
            install_crd(cluster)
            if gate:
                install_gang_crds(cluster)
            else:
                results["machine"] = machine(cluster) | {"kwok_nodes": args.nodes}
            api = Api(cluster.kubeconfig)
            create_namespace(api, "bind")
            operator = Operator(cluster, workdir, f"bind-{gate}", ["--namespace", "bind"], False, {})
            try:
                variants = [("plain-gate-on", None), ("kubernetes-gang", {"provider": "kubernetes"})]
                for variant, gang in variants if gate else [("plain-gate-off", None)]:
                    results["bind"] += bind_latency(
                        api, "bind", variant, sizes=sizes, repeats=args.repeats, gang=gang
                    )
            finally:
                operator.stop()
            if gate:
                sources = [("this", {})]
                if args.baseline_src is not None:
                    src = args.baseline_src.resolve()
                    sources.append(("baseline", {"PYTHONPATH": f"{src / 'operator'}:{src / 'trainer'}"}))
                for label, env in sources:
                    # An operator from before provider kubernetes existed refuses such a spec.
                    known = ("none", "kubernetes") if label == "this" else ("none",)
                    for integration in (*known, *GANG_APIS):
                        tag = f"{label}-{integration}"
                        print(f"requests: {tag}", flush=True)
                        results["requests"].append(
                            requests_per_job(
                                cluster, api, integration, jobs=args.jobs, workdir=workdir, env=env, tag=tag
                            )
                        )
        finally:
            cluster.stop()
    results["bind_summary"] = summarise(results["bind"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    args.out.with_suffix(".generated.md").write_text(render_markdown(results))
    print(render_markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
