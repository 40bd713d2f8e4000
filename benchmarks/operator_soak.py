"""The operator under hours of churn on a real control plane (kwok nodes): is every job right, and is it flat?

    .venv/bin/python benchmarks/operator_soak.py [--minutes 60] [--rate 0.4] [--nodes 16] [--run-for 60-240]
        [--warmup-minutes 10] [--sample-seconds 10] [--seed 1] [--operator-env KEY=VALUE]
        [--out benchmarks/results/operator-soak]

One operator process (`operator_instrumented.py`: API requests counted, per-object state sizes written
every 30 s) watches one namespace for --minutes while TrainingJobs of 2 to 4 workers are submitted at
--rate per second, each with pods that run for a random time in --run-for, mixed as issue 16's soak was:

- 10 % fail once with a retryable exit code (17, on restart attempt 0): Succeeded, 1 restart, attempt 1;
- 5 % fail with a non-retryable exit code (2): Failed, 0 restarts, attempt 0;
- 10 % are suspended once Running and resumed 5-15 s after Suspended: Succeeded, 0 restarts, attempt 1
  (their pods run twice as long, so that the suspension finds them running; one that finishes
  first all the same is reported as suspended too late, not as wrong);
- 20 % are deleted (background propagation, as kubectl does) at a random moment while Running;
- 10 % have one worker pod evicted through the Eviction API (as `kubectl drain` does) at a random moment
  while Running: Succeeded, 0 restarts counted, attempt 1, 1 disruption restart (their pods run twice
  as long, so that the eviction finds them running);
- the rest succeed: Succeeded, 0 restarts, attempt 0;
- half of all carry ttlSecondsAfterFinished (5-60 s), and the operator must delete them; the others are
  deleted by this script 5 s after their terminal phase (so the number alive stays flat).

Then submissions stop, every job still alive gets --drain-minutes to finish, the rest are deleted and
the garbage collector gets 3 minutes. Reported:

- duplicate creations: a watch on Services and Jobs from the start (`CreationCounter`) counts distinct
  uids per name; child names are deterministic per TrainingJob and attempt, so two uids for one name
  is a child created twice;
- orphans: children left after every TrainingJob is gone and the garbage collector had its time;
- wrong phases and restart counts: each job's terminal phase, status.restarts and status.restartAttempt
  (from a TrainingJob watch) against what its kind must end in; stuck: jobs not terminal --stuck-minutes
  after their pods' run time would have ended (twice for a restart or a resume), not terminal after the
  drain, or not deleted by their TTL 2 minutes after it passed;
- RSS and CPU of the operator sampled every --sample-seconds, with the least-squares slope per hour after
  --warmup-minutes (RSS in MB/h; CPU as cores used per sample interval, in cores/h), and the operator's
  own per-object state sizes (`KUBETRAIN_BENCH_STATE`) with their slopes;
- API requests per TrainingJob created, by verb and resource.

Results: OUT.json (every sample included) and OUT.generated.md; written every minute while it runs
(`"finished": false`), so a run cut short still says how far it got. Everything shares this machine's
CPUs with the control plane and kwok; on a shared 2-core machine the operator's CPU figures include
contention, but its RSS and state sizes do not depend on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import random
import sys
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

import urllib3

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kubetrain_operator.api import constants
from operator_scale import (
    CONTROL_PLANE_ARGS,
    REPO,
    TJ_PATH,
    Api,
    Operator,
    machine,
    namespace,
    plural_path,
    proc_stats,
    requests_table,
    trainingjob,
)
from testcluster.cluster import start_cluster
from testcluster.operator_process import CreationCounter, install_crd

NAMESPACE = "soak"
TERMINAL = ("Succeeded", "Failed")
KINDS = (
    ("retry", 0.10),
    ("permanent", 0.05),
    ("suspend", 0.10),
    ("delete", 0.20),
    ("evict", 0.10),
    ("normal", 0.45),
)
EXPECTED = {
    "normal": ("Succeeded", 0, 0, 0),
    "retry": ("Succeeded", 1, 1, 0),
    "permanent": ("Failed", 0, 0, 0),
    "suspend": ("Succeeded", 0, 1, 0),
    "evict": ("Succeeded", 0, 1, 1),
}
"""Kind -> (terminal phase, status.restarts, status.restartAttempt, status.disruptionRestarts) it must
end with."""
TWICE = ("suspend", "evict")
"""Kinds whose pods run twice as long, so that their suspension or eviction finds them running."""
KEEP_SECONDS = 5.0
TTL_GRACE_SECONDS = 120.0


# ---------------------------------------------------------------- what the TrainingJobs do


@dataclasses.dataclass
class Job:
    name: str
    kind: str
    workers: int
    run_for: int
    ttl: int | None
    submitted: float
    suspended_at: float | None = None
    suspended_seen: bool = False
    """The TrainingJob was seen Suspended (else it finished before the suspension reached it)."""
    resume_at: float | None = None
    resumed: bool = False
    delete_at: float | None = None
    deleted_by_us: bool = False
    evict_at: float | None = None
    evicted: str | None = None
    """The worker pod this script evicted."""
    final: tuple[str, int, int, int] | None = None
    """(phase, restarts, restartAttempt, disruptionRestarts) when first seen terminal."""
    terminal_at: float | None = None
    gone: bool = False
    stuck: bool = False

    def runs(self) -> int:
        """How many times its pods run: a restart, a resume and an eviction start them again."""
        return 2 if self.kind in ("retry", *TWICE) else 1


def manifest(job: Job) -> dict[str, Any]:
    body = trainingjob(job.name, job.workers, f"{job.run_for}s")
    annotations = body["spec"]["podAnnotations"]
    if job.kind == "retry":
        annotations |= {"sim.kubetrain.io/exit-code": "17", "sim.kubetrain.io/fail-attempt": "0"}
    elif job.kind == "permanent":
        annotations["sim.kubetrain.io/exit-code"] = "2"
    if job.ttl is not None:
        body["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": job.ttl}
    return body


class TrainingJobWatch:
    """The latest (phase, restarts, restartAttempt, disruptionRestarts) of every TrainingJob in the
    namespace, and which are
    gone; a thread on a raw watch stream, listing again on 410 Gone."""

    def __init__(self, client: Api, ns: str) -> None:
        self.client = client
        self.path = f"{TJ_PATH}/namespaces/{ns}/{constants.PLURAL}"
        self.state: dict[str, tuple[str | None, int, int, int]] = {}
        self.gone: set[str] = set()
        self.relists = 0
        self.lock = threading.Lock()
        self.version = self._list()
        threading.Thread(target=self._run, name="soak-tj-watch", daemon=True).start()

    def _list(self) -> str:
        listing = self.client.request("GET", self.path)
        with self.lock:
            present = set()
            for item in listing.get("items") or ():
                present.add(item["metadata"]["name"])
                self._note(item)
            self.gone |= set(self.state) - present
        return listing["metadata"]["resourceVersion"]

    def _note(self, obj: dict[str, Any]) -> None:
        status = obj.get("status") or {}
        self.state[obj["metadata"]["name"]] = (
            status.get("phase"),
            int(status.get("restarts") or 0),
            int(status.get("restartAttempt") or 0),
            int(status.get("disruptionRestarts") or 0),
        )

    def _run(self) -> None:
        while True:
            try:
                query = f"watch=1&allowWatchBookmarks=true&resourceVersion={self.version}&timeoutSeconds=300"
                response = self.client.pool.request(
                    "GET",
                    f"{self.client.server}{self.path}?{query}",
                    preload_content=False,
                    timeout=urllib3.Timeout(connect=10, read=360),
                )
                buffer = b""
                for chunk in response.stream(65536):
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        self._apply(json.loads(line))
                response.release_conn()
            except _GoneError:
                with self.lock:
                    self.relists += 1
                self.version = self._list()
            except Exception:  # a broken stream: watch again from the last version seen
                time.sleep(0.5)

    def _apply(self, event: dict[str, Any]) -> None:
        obj = event["object"]
        if event["type"] == "ERROR":
            if obj.get("code") == 410:
                raise _GoneError
            raise RuntimeError(str(obj))
        self.version = obj["metadata"].get("resourceVersion", self.version)
        if event["type"] == "BOOKMARK":
            return
        with self.lock:
            if event["type"] == "DELETED":
                self.gone.add(obj["metadata"]["name"])
            else:
                self._note(obj)

    def get(self, name: str) -> tuple[tuple[str | None, int, int, int] | None, bool]:
        with self.lock:
            return self.state.get(name), name in self.gone

    def alive(self) -> int:
        with self.lock:
            return len(set(self.state) - self.gone)


class _GoneError(Exception):
    pass


class Churn:
    """Submits TrainingJobs and drives each through its kind's script, one tick at a time."""

    def __init__(self, client: Api, watch: TrainingJobWatch, args: argparse.Namespace) -> None:
        self.client = client
        self.watch = watch
        self.args = args
        self.rng = random.Random(args.seed)
        self.jobs: dict[str, Job] = {}
        self.live: list[Job] = []
        self.run_min, self.run_max = (int(v) for v in args.run_for.split("-"))

    def submit(self, now: float) -> None:
        index = len(self.jobs)
        roll, kind = self.rng.random(), "normal"
        for candidate, share in KINDS:
            if roll < share:
                kind = candidate
                break
            roll -= share
        job = Job(
            name=f"soak-{index:06d}",
            kind=kind,
            workers=self.rng.randint(2, 4),
            run_for=self.rng.randint(self.run_min, self.run_max) * (2 if kind in TWICE else 1),
            ttl=self.rng.randint(5, 60) if self.rng.random() < 0.5 else None,
            submitted=now,
        )
        self.client.create(plural_path("TrainingJob", NAMESPACE), manifest(job))
        self.jobs[job.name] = job
        self.live.append(job)

    def tick(self, now: float) -> None:
        for job in list(self.live):
            self._step(job, now)
        self.live = [job for job in self.live if not job.gone]

    def _step(self, job: Job, now: float) -> None:
        state, gone = self.watch.get(job.name)
        phase, restarts, attempt, disruptions = state or (None, 0, 0, 0)
        if gone:
            job.gone = True
            return
        if job.deleted_by_us:
            return
        if phase in TERMINAL and job.final is None:
            job.final, job.terminal_at = (phase, restarts, attempt, disruptions), now
        if job.final is not None:
            if job.ttl is None and now - (job.terminal_at or now) >= KEEP_SECONDS:
                self.delete(job)
            elif job.ttl is not None and now - (job.terminal_at or now) > job.ttl + TTL_GRACE_SECONDS:
                job.stuck = True
            return
        if now - job.submitted > job.runs() * job.run_for + self.args.stuck_minutes * 60:
            job.stuck = True
        if job.kind == "delete" and phase == "Running":
            if job.delete_at is None:
                job.delete_at = now + self.rng.uniform(0, job.run_for / 2)
            elif now >= job.delete_at:
                self.delete(job)
        elif job.kind == "evict" and phase == "Running" and job.evicted is None:
            if job.evict_at is None:
                job.evict_at = now + self.rng.uniform(0, job.run_for / 2)
            elif now >= job.evict_at:
                job.evicted = self._evict_one_worker(job)
        elif job.kind == "suspend":
            if phase == "Running" and job.suspended_at is None:
                self._suspend(job, True)
                job.suspended_at = now
            elif phase == "Suspended" and job.resume_at is None:
                job.suspended_seen = True
                job.resume_at = now + self.rng.uniform(5, 15)
            elif job.resume_at is not None and not job.resumed and now >= job.resume_at:
                self._suspend(job, False)
                job.resumed = True

    def delete(self, job: Job) -> None:
        path = f"{plural_path('TrainingJob', NAMESPACE)}/{job.name}"
        self.client.request("DELETE", path, {"propagationPolicy": "Background"}, ok=(200, 202, 404))
        job.deleted_by_us = True

    def _evict_one_worker(self, job: Job) -> str | None:
        """Evict one running worker pod of the job's first attempt the way `kubectl drain` does: a POST
        to the pod's eviction subresource, which the API server answers by marking the pod with
        DisruptionTarget and deleting it; None while no such pod is running yet."""
        selector = f"{constants.LABEL_JOB_NAME}={job.name},{constants.LABEL_RESTART_ATTEMPT}=0"
        query = urllib.parse.urlencode({"labelSelector": selector})
        pods = self.client.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?{query}")
        running = sorted(
            pod["metadata"]["name"]
            for pod in pods.get("items") or ()
            if (pod.get("status") or {}).get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp")
        )
        if not running:
            return None
        victim = self.rng.choice(running)
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": victim, "namespace": NAMESPACE},
        }
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{victim}/eviction"
        self.client.request("POST", path, eviction, ok=(200, 201))
        return victim

    def _suspend(self, job: Job, value: bool) -> None:
        path = f"{self.client.server}{plural_path('TrainingJob', NAMESPACE)}/{job.name}"
        body = json.dumps({"spec": {"runPolicy": {"suspend": value}}}).encode()
        headers = {"Content-Type": "application/merge-patch+json", "Accept": "application/json"}
        response = self.client.pool.request("PATCH", path, body=body, headers=headers, timeout=60)
        if response.status != 200:
            raise RuntimeError(f"suspend={value} {job.name}: {response.status} {response.data[:300]!r}")


# ---------------------------------------------------------------- figures


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, in value per hour."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var * 3600


def leak_per_hour(points: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """Least-squares fit of value = a + b * live + c * seconds over (seconds, live, value) points:
    (c in value per hour, b in value per live TrainingJob). c is the growth that the number of live
    TrainingJobs does not explain: a leak, where a plain slope would also count a cache filling up."""
    n = len(points)
    if n < 4:
        return None
    mean = [sum(p[i] for p in points) / n for i in range(3)]
    t, x, y = ([p[i] - mean[i] for p in points] for i in range(3))
    stt, sxx, stx = (
        sum(v * v for v in t),
        sum(v * v for v in x),
        sum(a * b for a, b in zip(t, x, strict=True)),
    )
    sty, sxy = sum(a * b for a, b in zip(t, y, strict=True)), sum(a * b for a, b in zip(x, y, strict=True))
    det = stt * sxx - stx * stx
    if det <= 1e-9 * max(stt * sxx, 1e-12):
        return None  # live count constant or in lockstep with time: no separating them
    per_second = (sty * sxx - sxy * stx) / det
    per_live = (sxy * stt - sty * stx) / det
    return per_second * 3600, per_live


def _nearest(samples: list[dict[str, Any]], t: float) -> dict[str, Any]:
    return min(samples, key=lambda sample: abs(sample["t"] - t))


def read_state(path: Path) -> list[dict[str, Any]]:
    """The operator's state samples so far; a line it is still writing is left for the next read."""
    if not path.exists():
        return []
    complete, _, _ = path.read_text().rpartition("\n")
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def flatten(sample: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in sample.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        elif isinstance(value, int | float) and key != "time":
            out[f"{prefix}{key}"] = value
    return out


def summarise(
    churn: Churn,
    samples: list[dict[str, Any]],
    state: list[dict[str, Any]],
    started: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    kinds = Counter(job.kind for job in churn.jobs.values())
    wrong = []
    too_late = []
    for job in churn.jobs.values():
        expected = EXPECTED.get(job.kind)
        if job.kind == "suspend" and not job.suspended_seen and job.final == EXPECTED["normal"]:
            too_late.append(job.name)  # it finished before its suspension arrived: a normal job
        elif job.kind == "evict" and job.evicted is None and job.final == EXPECTED["normal"]:
            too_late.append(job.name)  # it finished before its eviction was due: a normal job
        elif expected is not None and job.final is not None and job.final != expected:
            wrong.append({"name": job.name, "kind": job.kind, "expected": expected, "actual": job.final})
    unfinished = [
        job.name
        for job in churn.jobs.values()
        if job.kind in EXPECTED and job.final is None and not job.deleted_by_us
    ]
    return {
        "jobs_created": len(churn.jobs),
        "kinds": dict(kinds),
        "with_ttl": sum(1 for job in churn.jobs.values() if job.ttl is not None),
        "terminal_checked": sum(1 for job in churn.jobs.values() if job.final is not None),
        "wrong_phase_or_restarts": wrong,
        "suspended_or_evicted_too_late": too_late,
        "evicted": sum(1 for job in churn.jobs.values() if job.evicted is not None),
        "never_terminal": unfinished,
        "stuck": sorted(job.name for job in churn.jobs.values() if job.stuck),
    } | memory_figures(samples, state, started, args.warmup_minutes * 60, args.minutes * 60)


def memory_figures(
    samples: list[dict[str, Any]], state: list[dict[str, Any]], started: float, warm: float, until: float
) -> dict[str, Any]:
    """RSS, CPU and state sizes over the steady churn: after the warm-up, until submissions stop (the
    drain after it empties the cluster, and RSS, which the allocator seldom gives back, would read flat
    for the wrong reason)."""
    after = [s for s in samples if warm <= s["t"] <= until]
    cpu_rates = [
        (b["t"], (b["cpu_seconds"] - a["cpu_seconds"]) / (b["t"] - a["t"]))
        for a, b in itertools.pairwise(after)
        if b["t"] > a["t"]
    ]
    state_after = [(s["time"] - started, flatten(s)) for s in state if warm <= s["time"] - started <= until]
    keys = sorted({k for _, flat in state_after for k in flat})
    state_summary = {}
    for key in keys:
        values = [(t, flat[key]) for t, flat in state_after if key in flat]
        live = [(t, flat["cache.trainingjobs"], flat[key]) for t, flat in state_after if key in flat]
        fit = leak_per_hour(live)
        state_summary[key] = {
            "first": values[0][1],
            "last": values[-1][1],
            "max": max(v for _, v in values),
            "slope_per_hour": slope_per_hour(values),
            "slope_per_hour_at_constant_live": fit[0] if fit else None,
            "per_live_trainingjob": fit[1] if fit else None,
        }
    rss_fit = leak_per_hour([(s["t"], s["alive"], s["rss_mb"]) for s in after])
    # What the process holds is its cache: TrainingJobs and children (a saturated cluster holds more pods
    # and Jobs per live TrainingJob as its backlog grows). RSS at the state sample's time, nearest sample.
    held = [
        (t, flat.get("cache.trainingjobs", 0) + flat.get("cache.placed", 0), _nearest(after, t)["rss_mb"])
        for t, flat in state_after
        if after
    ]
    held_fit = leak_per_hour(held)
    return {
        "alive_max": max((s["alive"] for s in samples), default=0),
        "alive_after_warmup_min_max": [
            min((s["alive"] for s in after), default=0),
            max((s["alive"] for s in after), default=0),
        ],
        "rss_mb": {
            "at_warmup": after[0]["rss_mb"] if after else None,
            "last": samples[-1]["rss_mb"] if samples else None,
            "max": max((s["rss_mb"] for s in samples), default=None),
            "slope_mb_per_hour_after_warmup": slope_per_hour([(s["t"], s["rss_mb"]) for s in after]),
            "slope_mb_per_hour_at_constant_live": rss_fit[0] if rss_fit else None,
            "mb_per_live_trainingjob": rss_fit[1] if rss_fit else None,
            "slope_mb_per_hour_at_constant_cached_objects": held_fit[0] if held_fit else None,
            "kb_per_cached_object": held_fit[1] * 1024 if held_fit else None,
        },
        "cpu": {
            "seconds_total": samples[-1]["cpu_seconds"] - samples[0]["cpu_seconds"] if samples else None,
            "cores_mean_after_warmup": (sum(r for _, r in cpu_rates) / len(cpu_rates) if cpu_rates else None),
            "cores_slope_per_hour_after_warmup": slope_per_hour(cpu_rates),
        },
        "operator_state_after_warmup": state_summary,
    }


def run(args: argparse.Namespace, workdir: Path, results: dict[str, Any]) -> None:
    print(f"starting a cluster with {args.nodes} kwok nodes ...", flush=True)
    cluster = start_cluster(nodes=0, extra_args=CONTROL_PLANE_ARGS)
    operator = None
    counter = None
    try:
        cluster.add_nodes(args.nodes, prefix="soak")
        install_crd(cluster)
        results["machine"] = machine(cluster) | {"kwok_nodes": args.nodes, "note": args.machine_note}
        client = Api(cluster.kubeconfig, maxsize=8)
        namespace(client, NAMESPACE)
        counter = CreationCounter(cluster)
        counter.start()
        watch = TrainingJobWatch(client, NAMESPACE)
        state_path = workdir / "state.jsonl"
        env = {"MALLOC_ARENA_MAX": "2", "KUBETRAIN_BENCH_STATE": str(state_path)}
        env |= dict(item.split("=", 1) for item in args.operator_env)
        operator = Operator(cluster, workdir, "soak", ["--namespace", NAMESPACE], False, env)
        churn = Churn(client, watch, args)
        samples: list[dict[str, Any]] = []
        started = time.time()
        results["started_at"] = started
        end = started + args.minutes * 60
        next_submit = next_sample = next_write = started
        print(f"churn for {args.minutes:g} min at {args.rate:g} TrainingJobs/s", flush=True)
        phase = "churn"
        drain_end = None
        while True:
            now = time.time()
            if phase == "churn" and now >= end:
                phase, drain_end = "drain", now + args.drain_minutes * 60
                print(f"  churn over: {len(churn.jobs)} submitted; draining", flush=True)
            if phase == "churn":
                while next_submit <= now:
                    churn.submit(now)
                    next_submit += 1 / args.rate
            churn.tick(now)
            if now >= next_sample:
                stats = proc_stats(operator.process.pid)
                samples.append(
                    {"t": now - started, "alive": watch.alive(), "submitted": len(churn.jobs)} | stats
                )
                next_sample += args.sample_seconds
            if now >= next_write:
                _progress(results, churn, samples, counter, watch, operator, started, args, state_path)
                _write(args.out, results)
                next_write += 60
            if phase == "drain" and (not churn.live or now >= (drain_end or now)):
                break
            time.sleep(0.25)
        print(f"  drained ({len(churn.live)} still alive); deleting what is left", flush=True)
        for job in churn.live:
            if job.final is None and not job.deleted_by_us:
                job.stuck = True  # not terminal after the drain
            churn.delete(job)
        orphans = _orphans(client, watch)
        final_stats = proc_stats(operator.process.pid)
        samples.append(
            {"t": time.time() - started, "alive": watch.alive(), "submitted": len(churn.jobs)} | final_stats
        )
        rows = operator.stop()
        operator = None
        counter.stop()
        _progress(results, churn, samples, counter, watch, None, started, args, state_path, rows)
        results["orphans"] = orphans
        results["finished"] = True
        _write(args.out, results)
    finally:
        if operator is not None:
            operator.stop()
        if counter is not None:
            counter.stop()
        cluster.stop()


def _progress(  # noqa: PLR0917
    results: dict[str, Any],
    churn: Churn,
    samples: list[dict[str, Any]],
    counter: CreationCounter,
    watch: TrainingJobWatch,
    operator: Operator | None,
    started: float,
    args: argparse.Namespace,
    state_path: Path,
    rows: list[dict[str, Any]] | None = None,
) -> None:
    state = read_state(state_path)
    duplicates = {f"{k[0]} {k[2]}": n for k, n in counter.duplicates().items() if k[1] == NAMESPACE}
    rows = rows if rows is not None else (operator.counts_now() if operator is not None else [])
    results["elapsed_minutes"] = round((time.time() - started) / 60, 1)
    results["duplicate_creations"] = duplicates
    results["children_created"] = counter.count(NAMESPACE)  # locked: its watch threads add to it
    results["creation_watch_relists"] = counter.relists
    results["trainingjob_watch_relists"] = watch.relists
    results["summary"] = summarise(churn, samples, state, started, args)
    results["requests"] = requests_table(rows, max(1, len(churn.jobs)))
    results["jobs"] = [dataclasses.asdict(job) for job in churn.jobs.values()]
    results["samples"] = samples
    results["operator_state"] = state


def _orphans(client: Api, watch: TrainingJobWatch) -> dict[str, Any]:
    """Children left once every TrainingJob is gone and the garbage collector had 3 minutes."""
    deadline = time.time() + 180
    left: dict[str, list[str]] = {}
    while time.time() < deadline:
        left = {}
        for kind, path in (
            ("Service", f"/api/v1/namespaces/{NAMESPACE}/services"),
            ("Job", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"),
            ("Pod", f"/api/v1/namespaces/{NAMESPACE}/pods"),
        ):
            items = client.request("GET", f"{path}?labelSelector={constants.LABEL_JOB_NAME}")["items"]
            left[kind] = [item["metadata"]["name"] for item in items]
        if watch.alive() == 0 and not any(left.values()):
            break
        time.sleep(2)
    return {"trainingjobs_alive": watch.alive(), "children": {k: v for k, v in left.items() if v}}


# ---------------------------------------------------------------- report


def render_markdown(results: dict[str, Any]) -> str:
    m = results.get("machine", {})
    s = results.get("summary", {})
    rss, cpu, req = s.get("rss_mb", {}), s.get("cpu", {}), results.get("requests", {})
    orphans = results.get("orphans", {}).get("children", {})
    state = s.get("operator_state_after_warmup", {})
    slope = rss.get("slope_mb_per_hour_after_warmup")
    leak = rss.get("slope_mb_per_hour_at_constant_live")

    def fmt(value: Any, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        f"Machine: {m.get('nproc')} CPUs ({m.get('cpu_model')}), {m.get('memory')} memory, load average at "
        f"start {' '.join(m.get('loadavg_at_start', []))}; {m.get('note', '')}; kube-apiserver "
        f"{m.get('kube_apiserver')}, {m.get('kwok_nodes')} kwok nodes; Python {m.get('python')}, kopf "
        f"{m.get('kopf')}.",
        "",
        f"Run: {results['args'].get('minutes')} min of churn at {results['args'].get('rate')} TrainingJobs/s "
        f"(finished: {results.get('finished', False)}, {results.get('elapsed_minutes')} min elapsed); "
        f"{s.get('jobs_created')} created {s.get('kinds')}, {s.get('with_ttl')} with a TTL, "
        f"{s.get('evicted')} pods evicted; alive at once "
        f"up to {s.get('alive_max')} ({s.get('alive_after_warmup_min_max')} after the warm-up).",
        "",
        "| target | measured | met |",
        "|---|---|---|",
        f"| 0 duplicate creations | {len(results.get('duplicate_creations', {}))} of "
        f"{results.get('children_created')} children | {_yes(not results.get('duplicate_creations'))} |",
        f"| 0 orphans | {sum(map(len, orphans.values()))} "
        f"{'(' + str(orphans) + ')' if orphans else ''} | {_yes('orphans' in results and not orphans)} |",
        f"| 0 wrong phases / restarts (an eviction: 1 disruption restart, 0 restarts counted) | "
        f"{len(s.get('wrong_phase_or_restarts', []))} of "
        f"{s.get('terminal_checked')} checked | {_yes(not s.get('wrong_phase_or_restarts'))} |",
        f"| 0 stuck | {len(s.get('stuck', []))} stuck, {len(s.get('never_terminal', []))} not terminal"
        f"{'' if results.get('finished') else ' yet'}, "
        f"{len(s.get('suspended_or_evicted_too_late', []))} suspended or evicted too late "
        f"| {_yes(not s.get('stuck') and not s.get('never_terminal'))} |",
        f"| RSS slope < 5 MB/h after {results['args'].get('warmup_minutes')} min | {fmt(slope, 2)} MB/h "
        f"({fmt(leak, 2)} MB/h at a constant number of live TrainingJobs, "
        f"{fmt(rss.get('mb_per_live_trainingjob'), 3)} MB per live one; "
        f"{fmt(rss.get('slope_mb_per_hour_at_constant_cached_objects'), 2)} MB/h at a constant number of "
        f"cached objects, {fmt(rss.get('kb_per_cached_object'), 1)} KB per object; "
        f"{fmt(rss.get('at_warmup'))} MB at "
        f"the warm-up's end, {fmt(rss.get('last'))} MB last, {fmt(rss.get('max'))} MB max) "
        f"| {_yes(slope is not None and slope < 5)} |",
        "",
        f"CPU: {fmt(cpu.get('seconds_total'))} s in all, {fmt(cpu.get('cores_mean_after_warmup'), 3)} cores "
        f"on average after the warm-up, slope {fmt(cpu.get('cores_slope_per_hour_after_warmup'), 4)} "
        "cores/h.",
        "",
        f"API requests per TrainingJob: {req.get('per_trainingjob')} {req.get('per_trainingjob_by_verb')}.",
        "",
        "Operator state from the warm-up to the end of submissions: first, last and largest size, "
        "least-squares slope per hour, and the slope and size per live TrainingJob when fitted against "
        "time and the number of TrainingJobs in the cache together:",
        "",
        "| structure | first | last | max | slope/h | slope/h at constant live | per live job |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, value in state.items():
        lines.append(
            f"| {key} | {fmt(value['first'], 0)} | {fmt(value['last'], 0)} | {fmt(value['max'], 0)} "
            f"| {fmt(value['slope_per_hour'], 1)} | {fmt(value.get('slope_per_hour_at_constant_live'), 1)} "
            f"| {fmt(value.get('per_live_trainingjob'), 2)} |"
        )
    return "\n".join(lines) + "\n"


def _yes(value: bool) -> str:
    return "yes" if value else "**no**"


def _write(out: Path, results: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    out.with_suffix(".generated.md").write_text(render_markdown(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long TrainingJobs are submitted")
    parser.add_argument("--rate", type=float, default=0.4, help="TrainingJobs submitted per second")
    parser.add_argument("--run-for", default="60-240", help="seconds a worker pod runs: MIN-MAX")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--warmup-minutes", type=float, default=10.0, help="left out of the slopes")
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--drain-minutes", type=float, default=30.0)
    parser.add_argument("--stuck-minutes", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--operator-env", action="append", default=[], metavar="KEY=VALUE", help="extra env for the operator"
    )
    parser.add_argument("--machine-note", default="", help="what else shares the machine, for the report")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "operator-soak")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        help="recompute the memory figures and tables of a stored OUT.json",
    )
    args = parser.parse_args(argv)
    if args.report is not None:
        return report(args.report)
    workdir = args.workdir or Path(f"/tmp/kubetrain-soak-{os.getpid()}")
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "finished": False}
    run(args, workdir, results)
    print(render_markdown(results))
    print(f"wrote {args.out}.json (workdir {workdir})")
    return 0


def report(path: Path) -> int:
    """Recompute the memory, CPU and state figures of a stored run (every sample is in its JSON) and
    write its tables again, for a run made by an earlier version of this script."""
    results = json.loads(path.read_text())
    state = results.get("operator_state") or []
    # Runs before `started_at` was recorded: the first state sample comes 30 s after the operator started,
    # which is within seconds of the churn's start.
    started = results.get("started_at") or (state[0]["time"] - 30 if state else 0.0)
    run_args = results["args"]
    results["summary"] |= memory_figures(
        results.get("samples") or [],
        state,
        started,
        float(run_args["warmup_minutes"]) * 60,
        float(run_args["minutes"]) * 60,
    )
    _write(path.with_suffix(""), results)
    print(render_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
