"""The operator's API requests per TrainingJob with and without Kueue, counted by the API server.

    .venv/bin/python benchmarks/kueue_requests.py [--jobs 5] [--out benchmarks/results/kueue-requests]

One control plane (kwok nodes) with an unmodified Kueue release beside it (tests/testcluster/kueue.py,
the Kueue suite's queue setup: a 4-CPU ClusterQueue) and the operator as a real process. The API server
writes an audit log (Metadata level) of every non-watch request on the objects the operator touches; a
request counts as the operator's when its user agent is the operator's (kubetrain-operator/...).

Two namespaces, the same 4-worker TrainingJob (1 CPU per worker, 1 s of simulated training) `--jobs`
times in each, one after the other (each runs to Succeeded before the next is applied): `plain` without
a queue label, `queued` labelled kueue.x-k8s.io/queue-name (admitted at once: the queue has room).
Per job: the operator's requests in its namespace divided by the jobs, by verb and resource. Lists and
watches are per operator, not per job, and are not counted.

Results: OUT.json and OUT.md (with the machine it ran on).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "kueue")]

from kueue_support import kueue_setup  # noqa: E402
from testcluster import kueue  # noqa: E402
from testcluster.cluster import Cluster, start_cluster  # noqa: E402
from testcluster.manifests import trainingjob  # noqa: E402
from testcluster.operator_process import OperatorProcess, install_crd  # noqa: E402

COUNTED = [
    {"group": "", "resources": ["services", "events"]},
    {"group": "batch", "resources": ["jobs"]},
    {"group": "kubetrain.io", "resources": ["trainingjobs", "trainingjobs/status"]},
    {"group": "kueue.x-k8s.io", "resources": ["workloads", "workloads/status", "workloadpriorityclasses"]},
    {"group": "scheduling.k8s.io", "resources": ["priorityclasses"]},
]
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["list", "watch"]},
        {"level": "Metadata", "resources": COUNTED},
        {"level": "None"},
    ],
}


def job(name: str, queued: bool) -> dict[str, Any]:
    manifest = trainingjob(
        name, workers=4, annotations={"sim.kubetrain.io/run-for": "1s"}, resources={"requests": {"cpu": "1"}}
    )
    if queued:
        manifest["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
    return manifest


def run_jobs(cluster: Cluster, namespace: str, jobs: int, queued: bool) -> None:
    for index in range(jobs):
        name = f"job-{index}"
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(job(name, queued)))
        cluster.kubectl("-n", namespace, "wait", "--for=condition=Succeeded", f"tj/{name}", "--timeout=180s")


def count(audit_log: Path, namespace: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in audit_log.read_text().splitlines():
        entry = json.loads(line)
        ref = entry.get("objectRef") or {}
        if "kubetrain-operator" not in entry.get("userAgent", "") or ref.get("namespace") != namespace:
            continue
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        counts[f"{entry['verb']} {resource}"] += 1
    return counts


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return {
        "cpus": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "kueue-requests")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kueue-requests-"))
    audit_log = work / "audit.log"
    policy = work / "policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    flags = [f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}"]
    cluster = start_cluster(nodes=2, extra_args={"kube-apiserver": flags})
    results: dict[str, Any] = {"machine": machine(), "jobs": args.jobs}
    try:
        install_crd(cluster)
        cluster.kubectl("label", "nodes", "--all", "kubetrain.io/test-pool=kueue")
        with kueue.running_kueue(cluster, work / "kueue"):
            cluster.apply(kueue_setup())
            operator = OperatorProcess(cluster, work / "operator.log", extra_args=("--metrics-port", "0"))
            operator.start()
            try:
                for mode, queued in (("plain", False), ("queued", True)):
                    namespace = f"{mode}-requests"
                    cluster.kubectl("create", "namespace", namespace)
                    cluster.apply(
                        {
                            "apiVersion": "kueue.x-k8s.io/v1beta2",
                            "kind": "LocalQueue",
                            "metadata": {"name": "team", "namespace": namespace},
                            "spec": {"clusterQueue": "training"},
                        }
                    )
                    subprocess.run(["sleep", "2"], check=True)  # the default ServiceAccount (pods need it)
                    run_jobs(cluster, namespace, args.jobs, queued)
                    subprocess.run(["sleep", "3"], check=True)  # the last job's Finished write and events
                    counts = count(audit_log, namespace)
                    results[mode] = {
                        "per_job": sum(counts.values()) / args.jobs,
                        "by_request": {key: value / args.jobs for key, value in sorted(counts.items())},
                    }
            finally:
                operator.stop()
    finally:
        cluster.stop_and_verify()
    results["extra_per_job"] = results["queued"]["per_job"] - results["plain"]["per_job"]
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Operator API requests per TrainingJob, with and without Kueue",
        "",
        "Generated by benchmarks/kueue_requests.py.",
        "",
        f"Machine: {results['machine']['cpus']} CPUs ({results['machine']['cpu']}), Python "
        f"{results['machine']['python']}, {results['machine']['date']}. {args.jobs} jobs per mode, 4 "
        "workers each, one after the other; Kueue v0.19.2 admitting at once (the queue has room).",
        "",
        "| request | plain | queued |",
        "|---|---|---|",
    ]
    keys = sorted(set(results["plain"]["by_request"]) | set(results["queued"]["by_request"]))
    for key in keys:
        plain, queued = (
            results["plain"]["by_request"].get(key, 0),
            results["queued"]["by_request"].get(key, 0),
        )
        lines.append(f"| {key} | {plain:g} | {queued:g} |")
    lines += [
        f"| **total per job** | **{results['plain']['per_job']:g}** | **{results['queued']['per_job']:g}** |",
        "",
        f"Extra requests per queued TrainingJob: **{results['extra_per_job']:g}** (target: at most 2).",
        "",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
