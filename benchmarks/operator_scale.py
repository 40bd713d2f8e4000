"""The operator at scale, against the physical floor, on a real control plane (kwok nodes).

    .venv/bin/python benchmarks/operator_scale.py [--sizes 100,500] [--workers 4] [--nodes 24]
        [--paced 100@2] [--rss-jobs 1000] [--threads 16] [--profile] [--skip-floor] [--rss-tracemalloc]
        [--operator-env KEY=VALUE] [--out benchmarks/results/operator-scale]

Results: OUT.json (everything) and OUT.generated.md (tables); benchmarks/results/operator-scale.md
explains them. `--profile` writes a cProfile of the operator's event loop to the workdir.

For each N in --sizes, in one cluster started here (start_cluster, `--nodes` kwok nodes of 110 pods):

1. floor: a plain client (urllib3, raw JSON, --threads threads on keep-alive connections) creates
   N Services and N x W Jobs built by the operator's own builders (ownerReferences removed) as fast as
   the API accepts them. Floor time = first request -> last child seen by the watch; also -> every Job
   Complete (kwok runs each pod for --run-for).
2. operator: `kubetrain operator --namespace op-N` runs as a real process (wrapped by
   operator_instrumented.py, which counts its API requests by client, verb and resource); the same client
   submits N TrainingJobs of W workers. Per TrainingJob: creation (its ADDED watch event) -> Service and
   W Jobs all seen (their ADDED events), p50/p95/p99. Operator total = first submit -> last child seen;
   ratio = operator total / floor time. Also -> every TrainingJob Succeeded. CPU seconds (utime+stime of
   /proc/PID/stat, all threads) and peak RSS (VmHWM) of the operator process.

Paced (--paced N@RATE): N TrainingJobs submitted one every 1/RATE s; creation -> children per job.

Then RSS: --rss-jobs suspended TrainingJobs are added, a fresh operator watching all namespaces starts,
and its VmHWM is read once every TrainingJob present has been reconciled.

All timestamps come from one watcher process (a subprocess of this script: raw watch streams of
TrainingJobs, Services and Jobs), so creation and children times share a clock and a pipeline delay.
Everything (control plane, kwok, operator, client, watcher) shares this machine's CPUs: on 2 cores the
absolute times are dominated by contention; the ratios within one run are the meaningful figures.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import urllib3
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from kubetrain_operator import api  # noqa: E402
from kubetrain_operator.api import constants  # noqa: E402
from kubetrain_operator.planning import builders  # noqa: E402
from testcluster.cluster import Cluster, start_cluster  # noqa: E402
from testcluster.operator_process import install_crd  # noqa: E402

LABEL = constants.LABEL_JOB_NAME
TJ_PATH = f"/apis/{constants.GROUP}/{constants.VERSION}"
CLK_TCK = os.sysconf("SC_CLK_TCK")
CONTROL_PLANE_ARGS = {
    "kube-controller-manager": ["--kube-api-qps=300", "--kube-api-burst=600", "--concurrent-job-syncs=20"],
    "kube-scheduler": ["--kube-api-qps=300", "--kube-api-burst=600"],
}
"""The controller manager's default client QPS (20) would make the Job controller, not the operator or the
floor, the limit on pods; every phase of every benchmark gets the same raised limits."""


# ---------------------------------------------------------------- a raw client


class Api:
    """Raw JSON over one keep-alive urllib3 pool, with the kubeconfig's client certificate."""

    def __init__(self, kubeconfig: Path, maxsize: int = 16) -> None:
        cfg = yaml.safe_load(kubeconfig.read_text())
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        self.server = cluster["server"]
        self.pool = urllib3.PoolManager(
            num_pools=2,
            maxsize=maxsize,
            block=True,
            ca_certs=cluster["certificate-authority"],
            cert_file=user["client-certificate"],
            key_file=user["client-key"],
            cert_reqs="CERT_REQUIRED",
        )

    def request(
        self, method: str, path: str, body: Any = None, *, ok: tuple[int, ...] = (200, 201, 202)
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        for attempt in range(20):
            response = self.pool.request(method, self.server + path, body=data, headers=headers, timeout=60)
            if response.status == 429 or (response.status >= 500 and attempt < 19):
                time.sleep(0.2 * (attempt + 1))  # the API server's max-inflight limit: retry as kubectl does
                continue
            break
        if response.status not in ok:
            raise RuntimeError(f"{method} {path}: {response.status} {response.data[:300]!r}")
        return json.loads(response.data or b"{}")

    def create(self, path: str, manifest: dict[str, Any]) -> None:
        self.request("POST", path, manifest)


def plural_path(kind: str, namespace: str) -> str:
    prefix = {"Job": "/apis/batch/v1", "Service": "/api/v1", "TrainingJob": TJ_PATH}[kind]
    plural = {"Job": "jobs", "Service": "services", "TrainingJob": constants.PLURAL}[kind]
    return f"{prefix}/namespaces/{namespace}/{plural}"


# ---------------------------------------------------------------- the watcher (a subprocess)

WATCHED = {
    "TrainingJob": (f"{TJ_PATH}/{constants.PLURAL}", ""),
    "Service": ("/api/v1/services", LABEL),
    "Job": ("/apis/batch/v1/jobs", LABEL),
}


def _watch_one(api: Api, kind: str, out: Any, lock: threading.Lock, ready: threading.Event) -> None:
    path, selector = WATCHED[kind]
    query = f"labelSelector={selector}&" if selector else ""
    rv = api.request("GET", f"{path}?{query}limit=1")["metadata"]["resourceVersion"]
    ready.set()
    while True:
        try:
            response = api.pool.request(
                "GET",
                f"{api.server}{path}?{query}watch=1&resourceVersion={rv}&timeoutSeconds=600",
                preload_content=False,
                timeout=urllib3.Timeout(connect=10, read=700),
            )
            buffer = b""
            for chunk in response.stream(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    now = time.time()
                    event = json.loads(line)
                    obj = event["object"]
                    meta = obj.get("metadata", {})
                    if event["type"] == "ERROR":
                        raise RuntimeError(str(obj))
                    rv = meta.get("resourceVersion", rv)
                    if event["type"] == "BOOKMARK":
                        continue
                    status = obj.get("status") or {}
                    if kind == "TrainingJob":
                        extra = f"{status.get('phase') or '-'}:{status.get('restarts') or 0}"
                        owner = meta["name"]
                    else:
                        done = any(
                            c.get("type") == "Complete" and c.get("status") == "True"
                            for c in status.get("conditions") or ()
                        )
                        extra = "complete" if done else "-"
                        owner = (meta.get("labels") or {}).get(LABEL, "")
                    with lock:
                        out.write(
                            f"{now:.4f}\t{kind}\t{event['type']}\t{meta['namespace']}\t{meta['name']}\t"
                            f"{owner}\t{extra}\n"
                        )
                        out.flush()
        except Exception as exc:  # reconnect from the last resourceVersion
            with lock:
                out.write(f"{time.time():.4f}\t#\t{kind}\t{exc!r}\n")
                out.flush()
            time.sleep(0.5)


def watcher_main(kubeconfig: str, out_path: str) -> None:
    api = Api(Path(kubeconfig), maxsize=8)
    lock = threading.Lock()
    with Path(out_path).open("a") as out:
        readies = []
        for kind in WATCHED:
            ready = threading.Event()
            threading.Thread(target=_watch_one, args=(api, kind, out, lock, ready), daemon=True).start()
            readies.append(ready)
        for ready in readies:
            ready.wait()
        with lock:
            out.write(f"{time.time():.4f}\tREADY\n")
            out.flush()
        while True:
            time.sleep(3600)


class Watch:
    """Tails the watcher's file: per namespace, ADDED times and latest state of every object."""

    def __init__(self, cluster: Cluster, path: Path) -> None:
        self.path = path
        path.write_text("")
        self.process = subprocess.Popen(
            [sys.executable, __file__, "_watch", str(cluster.kubeconfig), str(path)],
            start_new_session=True,
        )
        self._offset = 0
        self.added: dict[tuple[str, str, str], float] = {}  # (kind, ns, name) -> first ADDED
        self.owner: dict[tuple[str, str, str], str] = {}
        self.state: dict[tuple[str, str, str], tuple[float, str]] = {}  # latest extra, and when it appeared
        self.phases: dict[tuple[str, str], list[str]] = defaultdict(list)  # TJ -> phase:restarts history
        self.errors: list[str] = []
        self.ready = False
        deadline = time.monotonic() + 60
        while not self.ready:
            self.poll()
            if time.monotonic() > deadline:
                raise RuntimeError("watcher not ready")
            time.sleep(0.1)

    def poll(self) -> None:
        with self.path.open() as f:
            f.seek(self._offset)
            data = f.read()
        complete, _, _ = data.rpartition("\n")
        if not complete:
            return
        self._offset += len(complete.encode()) + 1
        for line in complete.split("\n"):
            parts = line.split("\t")
            if len(parts) == 2 and parts[1] == "READY":
                self.ready = True
                continue
            if parts[1] == "#":
                self.errors.append(line)
                continue
            t, kind, etype, ns, name, owner, extra = float(parts[0]), *parts[1:]
            key = (kind, ns, name)
            if etype == "DELETED":
                continue
            self.added.setdefault(key, t)
            self.owner[key] = owner
            previous = self.state.get(key)
            if previous is None or previous[1] != extra:
                self.state[key] = (t, extra)
                if kind == "TrainingJob":
                    self.phases[(ns, name)].append(extra)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def children(self, ns: str) -> dict[str, list[float]]:
        out: dict[str, list[float]] = defaultdict(list)
        for key, t in self.added.items():
            if key[1] == ns and key[0] in ("Service", "Job"):
                out[self.owner[key]].append(t)
        return out

    def count(self, ns: str, kind: str, extra: str | None = None) -> int:
        return sum(
            1
            for key, (_, value) in self.state.items()
            if key[0] == kind and key[1] == ns and (extra is None or value.split(":")[0] == extra)
        )

    def last_state_time(self, ns: str, kind: str, extra: str) -> float:
        return max(
            t for key, (t, v) in self.state.items() if key[:2] == (kind, ns) and v.split(":")[0] == extra
        )


def wait(predicate: Any, timeout: float, what: str, watch: Watch) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        watch.poll()
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


# ---------------------------------------------------------------- the process under test


def proc_stats(pid: int) -> dict[str, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14, 15 of stat(5)
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    kb = lambda key: int(status[key].split()[0])  # noqa: E731
    return {"cpu_seconds": cpu, "peak_rss_mb": kb("VmHWM") / 1024, "rss_mb": kb("VmRSS") / 1024}


class Operator:
    def __init__(  # noqa: PLR0917
        self, cluster: Cluster, workdir: Path, tag: str, args: list[str], profile: bool, env: dict[str, str]
    ) -> None:
        self.counts = workdir / f"requests-{tag}.json"
        self.profile = workdir / f"profile-{tag}.prof" if profile else None
        self.log = workdir / f"operator-{tag}.log"
        argv = [sys.executable, str(REPO / "benchmarks" / "operator_instrumented.py"), str(self.counts)]
        if self.profile:
            argv.append(str(self.profile))
        argv += ["--", "operator", "--metrics-port", "0", "--liveness", "", *args]
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), **env}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + 300  # kopf lists every watched object before it watches
        while not self._watching():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()  # never leave it behind, retrying against a cluster about to go
                raise RuntimeError(f"operator did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        time.sleep(1.0)  # the watch streams are open; let kopf settle

    def _watching(self) -> bool:
        return any(r["verb"] == "watch" and r["resource"] == constants.PLURAL for r in self.counts_now())

    def stats(self) -> dict[str, float]:
        return proc_stats(self.process.pid)

    def counts_now(self) -> list[dict[str, Any]]:
        """The request counts as last written (the wrapper writes them twice a second)."""
        try:
            return json.loads(self.counts.read_text())["requests"]
        except (OSError, ValueError):
            return []

    def stop(self) -> list[dict[str, Any]]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        return self.counts_now()


def operator_env(args: argparse.Namespace) -> dict[str, str]:
    return dict(item.split("=", 1) for item in args.operator_env)


# ---------------------------------------------------------------- workloads


def trainingjob(name: str, workers: int, run_for: str, suspend: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": "registry.local/kubetrain-trainer:bench",
        "workers": workers,
        "trainer": {"epochs": 1, "data": {"dataset": "fake"}},
        "podAnnotations": {"sim.kubetrain.io/run-for": run_for},
    }
    if suspend:
        spec["runPolicy"] = {"suspend": True}
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name},
        "spec": spec,
    }


def floor_objects(ns: str, count: int, workers: int, run_for: str) -> list[tuple[str, dict[str, Any]]]:
    """The Services and Jobs the operator would create for `count` TrainingJobs, without owners."""
    out = []
    for i in range(count):
        body = trainingjob(f"tj-{i:05d}", workers, run_for)
        spec = api.TrainingJobSpec.model_validate(body["spec"])
        ctx = builders.Context(owner=builders.Owner(f"tj-{i:05d}", ns, f"floor-{i}"), spec=spec)
        for manifest in (builders.build_service(ctx), *builders.build_worker_jobs(ctx)):
            manifest["metadata"].pop("ownerReferences", None)
            out.append((manifest["kind"], manifest))
    return out


def create_all(client: Api, ns: str, items: list[tuple[str, dict[str, Any]]], threads: int) -> float:
    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(client.create, plural_path(kind, ns), body) for kind, body in items]:
            future.result()
    return time.time() - started


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1], "n": len(ordered)}


def namespace(client: Api, name: str) -> None:
    client.request(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # pods need the namespace's default ServiceAccount
        try:
            client.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")
            return
        except RuntimeError:
            time.sleep(0.2)
    raise RuntimeError(f"no default ServiceAccount in {name}")


def run_floor(client: Api, watch: Watch, n: int, w: int, args: argparse.Namespace) -> dict[str, Any]:
    ns = f"floor-{n}"
    namespace(client, ns)
    items = floor_objects(ns, n, w, args.run_for)
    started = time.time()
    submit = create_all(client, ns, items, args.threads)
    wait(lambda: sum(map(len, watch.children(ns).values())) >= len(items), 900, "floor children", watch)
    last_child = max(t for ts in watch.children(ns).values() for t in ts)
    wait(lambda: watch.count(ns, "Job", "complete") >= n * w, 1800, "floor Jobs complete", watch)
    complete = watch.last_state_time(ns, "Job", "complete")
    out = {
        "objects": len(items),
        "submit_seconds": submit,
        "children_seconds": last_child - started,
        "all_complete_seconds": complete - started,
    }
    print(
        f"  floor N={n}: {len(items)} objects created in {out['children_seconds']:.2f}s "
        f"({len(items) / out['children_seconds']:.0f}/s); "
        f"all Jobs complete after {out['all_complete_seconds']:.1f}s"
    )
    return out


def requests_table(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    by_verb: Counter[str] = Counter()
    detail: Counter[str] = Counter()
    latency: dict[str, float] = {}
    connects = 0
    for row in rows:
        if row["verb"] == "tls-connect":
            connects += row["count"]
            continue
        by_verb[row["verb"]] += row["count"]
        detail[f"{row['client']} {row['verb']} {row['resource']}"] += row["count"]
        if row.get("seconds") and row["client"] == "kube":
            latency[f"{row['verb']} {row['resource']}"] = round(row["seconds"] / row["count"], 4)
    total = sum(by_verb.values())
    return {
        "total": total,
        "per_trainingjob": round(total / n, 2),
        "per_trainingjob_by_verb": {v: round(c / n, 2) for v, c in sorted(by_verb.items())},
        "detail": dict(sorted(detail.items(), key=lambda kv: -kv[1])),
        "new_tls_connections_kube_client": connects,
        "mean_seconds_per_request_kube_client": latency,
    }


def run_operator(  # noqa: PLR0917
    cluster: Cluster,
    client: Api,
    watch: Watch,
    n: int,
    w: int,
    args: argparse.Namespace,
    workdir: Path,
    rate: float | None = None,
) -> dict[str, Any]:
    """Burst (rate None): N TrainingJobs as fast as the API accepts them. Paced: one every 1/rate seconds."""
    ns = f"op-{n}" if rate is None else f"paced-{n}"
    namespace(client, ns)
    operator = Operator(cluster, workdir, ns, ["--namespace", ns], args.profile, operator_env(args))
    before = operator.stats()
    started = time.time()
    bodies = [("TrainingJob", trainingjob(f"tj-{i:05d}", w, args.run_for)) for i in range(n)]
    if rate is None:
        submit = create_all(client, ns, bodies, args.threads)
    else:
        for index, (kind, body) in enumerate(bodies):
            time.sleep(max(0.0, started + index / rate - time.time()))
            client.create(plural_path(kind, ns), body)
        submit = time.time() - started
    wait(lambda: sum(map(len, watch.children(ns).values())) >= n * (1 + w), 900, "operator children", watch)
    children = watch.children(ns)
    last_child = max(t for ts in children.values() for t in ts)
    latencies = [max(children[name]) - watch.added[("TrainingJob", ns, name)] for name in children]
    at_children = operator.stats()
    rows_at_children = operator.counts_now()
    wait(lambda: watch.count(ns, "TrainingJob", "Succeeded") >= n, 1800, "TrainingJobs Succeeded", watch)
    succeeded = watch.last_state_time(ns, "TrainingJob", "Succeeded")
    time.sleep(2)  # the last status patches and events
    after = operator.stats()
    rows = operator.stop()
    out = {
        "submit_seconds": submit,
        "children_seconds": last_child - started,
        "creation_to_children_seconds": percentiles(latencies),
        "all_succeeded_seconds": succeeded - started,
        "cpu_seconds_to_children": at_children["cpu_seconds"] - before["cpu_seconds"],
        "cpu_seconds_total": after["cpu_seconds"] - before["cpu_seconds"],
        "peak_rss_mb": after["peak_rss_mb"],
        "requests": requests_table(rows, n),
        "requests_until_children": requests_table(rows_at_children, n),
    }
    if operator.profile:
        out["profile"] = str(operator.profile)
    lat = out["creation_to_children_seconds"]
    print(
        f"  operator N={n}: submitted in {submit:.2f}s; all children after {out['children_seconds']:.2f}s; "
        f"creation->children p50 {lat['p50']:.3f}s p95 {lat['p95']:.3f}s p99 {lat['p99']:.3f}s; "
        f"all Succeeded after {out['all_succeeded_seconds']:.1f}s"
    )
    print(
        f"    CPU {out['cpu_seconds_total']:.1f}s ({out['cpu_seconds_to_children']:.1f}s until children), "
        f"peak RSS {out['peak_rss_mb']:.0f} MB, {out['requests']['per_trainingjob']} requests/TrainingJob "
        f"{out['requests']['per_trainingjob_by_verb']}, "
        f"new TLS connections {out['requests']['new_tls_connections_kube_client']}"
    )
    print(f"    requests until the last child: {out['requests_until_children']['detail']}")
    return out


def run_rss(
    cluster: Cluster, client: Api, watch: Watch, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    ns = "rss"
    namespace(client, ns)
    bodies = [
        ("TrainingJob", trainingjob(f"idle-{i:05d}", 4, args.run_for, suspend=True))
        for i in range(args.rss_jobs)
    ]
    create_all(client, ns, bodies, args.threads)
    wait(lambda: watch.count(ns, "TrainingJob") >= args.rss_jobs, 300, "idle TrainingJobs", watch)
    present = sum(1 for key in watch.state if key[0] == "TrainingJob")
    started = time.time()
    env = operator_env(args)
    if args.rss_tracemalloc:
        env["KUBETRAIN_BENCH_TRACEMALLOC"] = str(workdir / "tracemalloc.txt")
    operator = Operator(cluster, workdir, "rss", ["--all-namespaces"], False, env)
    wait(lambda: watch.count(ns, "TrainingJob", "Suspended") >= args.rss_jobs, 900, "all Suspended", watch)
    settled = time.time() - started
    # Resume handlers reconcile every TrainingJob present once; wait for the request rate to go quiet.
    previous, quiet_since = -1, time.monotonic()
    while time.monotonic() - quiet_since < 10 and time.time() - started < 600:
        total = sum(r["count"] for r in operator.counts_now())
        if total != previous:
            previous, quiet_since = total, time.monotonic()
        time.sleep(1)
    stats = operator.stats()
    operator.stop()
    out = {
        "trainingjobs_present": present,
        "seconds_until_all_reconciled": settled,
        "peak_rss_mb": stats["peak_rss_mb"],
        "rss_mb": stats["rss_mb"],
        "cpu_seconds": stats["cpu_seconds"],
    }
    print(
        f"  RSS with {present} TrainingJobs present: peak {out['peak_rss_mb']:.0f} MB, "
        f"now {out['rss_mb']:.0f} MB "
        f"(new {args.rss_jobs} reconciled after {settled:.1f}s)"
    )
    return out


# ---------------------------------------------------------------- machine and report


def host() -> dict[str, Any]:
    """The machine a benchmark ran on, as every benchmark's results record it (figures travel with it)."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "memory": mem.split(":", 1)[1].strip(),
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def machine(cluster: Cluster) -> dict[str, Any]:
    version = json.loads(cluster.kubectl("version", "-o", "json"))
    import aiohttp
    import kopf
    import kubernetes

    return {
        **host(),
        "kopf": kopf.__version__ if hasattr(kopf, "__version__") else "?",
        "kubernetes_client": kubernetes.__version__,
        "aiohttp": aiohttp.__version__,
        "kube_apiserver": version.get("serverVersion", {}).get("gitVersion"),
        "kwok_nodes": None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,500")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=24)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--run-for", default="2s")
    parser.add_argument("--rss-jobs", type=int, default=1000)
    parser.add_argument(
        "--paced",
        default="100@2",
        help="N@RATE: N TrainingJobs submitted at RATE per second (latency); '' skips",
    )
    parser.add_argument(
        "--operator-env", action="append", default=[], metavar="KEY=VALUE", help="extra env for the operator"
    )
    parser.add_argument("--skip-floor", action="store_true", help="operator runs only (no ratios)")
    parser.add_argument(
        "--rss-tracemalloc",
        action="store_true",
        help="trace the RSS phase's Python heap (workdir/tracemalloc.txt)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the operator's event loop thread")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "operator-scale")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    workdir = args.workdir or Path(f"/tmp/kubetrain-bench-{os.getpid()}")
    workdir.mkdir(parents=True, exist_ok=True)

    print(f"starting a cluster with {args.nodes} kwok nodes ...", flush=True)
    cluster = start_cluster(nodes=0, extra_args=CONTROL_PLANE_ARGS)
    watch = None
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": {}}
    try:
        cluster.add_nodes(args.nodes, prefix="bench")
        install_crd(cluster)
        results["machine"] = machine(cluster)
        results["machine"]["kwok_nodes"] = args.nodes
        client = Api(cluster.kubeconfig, maxsize=args.threads)
        watch = Watch(cluster, workdir / "watch.tsv")
        for n in sizes:
            print(f"N={n} W={args.workers}", flush=True)
            run: dict[str, Any] = {}
            if not args.skip_floor:
                run["floor"] = run_floor(client, watch, n, args.workers, args)
            run["operator"] = run_operator(cluster, client, watch, n, args.workers, args, workdir)
            results["runs"][str(n)] = run
            if args.skip_floor:
                continue
            run["ratio_children"] = run["operator"]["children_seconds"] / run["floor"]["children_seconds"]
            run["ratio_all_done"] = (
                run["operator"]["all_succeeded_seconds"] / run["floor"]["all_complete_seconds"]
            )
            print(
                f"  operator/floor: children {run['ratio_children']:.2f}x, "
                f"all done {run['ratio_all_done']:.2f}x",
                flush=True,
            )
            results["runs"][str(n)] = run
            _write(args.out, results)
        if args.paced:
            n, rate = args.paced.split("@")
            print(f"paced: {n} TrainingJobs at {rate}/s", flush=True)
            results["paced"] = run_operator(
                cluster, client, watch, int(n), args.workers, args, workdir, rate=float(rate)
            )
            results["paced"]["rate_per_second"] = float(rate)
            _write(args.out, results)
        if args.rss_jobs:
            results["rss"] = run_rss(cluster, client, watch, args, workdir)
        results["watch_errors"] = watch.errors[:20]
        _write(args.out, results)
    finally:
        if watch is not None:
            watch.stop()
        cluster.stop()
    print(f"wrote {args.out}.json (workdir {workdir})")
    return 0


def _write(out: Path, results: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".generated.md").write_text(render_markdown(results))


def render_markdown(results: dict[str, Any]) -> str:
    """The figures of one run as Markdown tables (benchmarks/results/operator-scale.md quotes them)."""
    m = results.get("machine", {})
    lines = [
        f"Machine: {m.get('nproc')} CPUs ({m.get('cpu_model')}), {m.get('memory')} memory, load average at "
        f"start {' '.join(m.get('loadavg_at_start', []))}; kube-apiserver {m.get('kube_apiserver')}, "
        f"{m.get('kwok_nodes')} kwok nodes; Python {m.get('python')}, kopf {m.get('kopf')}, kubernetes "
        f"client {m.get('kubernetes_client')}, aiohttp {m.get('aiohttp')}.",
        "",
        "| N x W | floor: children | operator: children | ratio | creation->children p50 / p95 / p99 "
        "| floor: all complete | operator: all Succeeded | ratio | operator CPU s | peak RSS MB "
        "| requests / TrainingJob |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    workers = results["args"].get("workers")
    for n, run in results.get("runs", {}).items():
        if "floor" not in run:
            continue
        floor, op = run["floor"], run["operator"]
        lat = op["creation_to_children_seconds"]
        verbs = ", ".join(f"{v} {c:g}" for v, c in op["requests"]["per_trainingjob_by_verb"].items())
        lines.append(
            f"| {n} x {workers} | {floor['children_seconds']:.1f} s | {op['children_seconds']:.1f} s "
            f"| {run['ratio_children']:.2f} | {lat['p50']:.2f} / {lat['p95']:.2f} / {lat['p99']:.2f} s "
            f"| {floor['all_complete_seconds']:.1f} s | {op['all_succeeded_seconds']:.1f} s "
            f"| {run['ratio_all_done']:.2f} | {op['cpu_seconds_total']:.1f} | {op['peak_rss_mb']:.0f} "
            f"| {op['requests']['per_trainingjob']:g} ({verbs}) |"
        )
    if "paced" in results:
        op = results["paced"]
        lat = op["creation_to_children_seconds"]
        lines += [
            "",
            f"Paced: {lat['n']} TrainingJobs x {workers} workers submitted at {op['rate_per_second']:g}/s: "
            f"creation->children p50 {lat['p50']:.2f} s, p95 {lat['p95']:.2f} s, p99 {lat['p99']:.2f} s, "
            f"max {lat['max']:.2f} s; {op['requests']['per_trainingjob']:g} requests per TrainingJob.",
        ]
    if "rss" in results:
        r = results["rss"]
        lines += [
            "",
            f"RSS with {r['trainingjobs_present']} TrainingJobs present (operator watching all namespaces, "
            f"started after they existed): peak {r['peak_rss_mb']:.0f} MB, settled {r['rss_mb']:.0f} MB.",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_watch":
        watcher_main(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
