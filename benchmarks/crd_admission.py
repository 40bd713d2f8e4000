"""What the TrainingJob CRD's validation costs the API server: variants of the CRD side by side on one
control plane, N creations (and N status patches) each, with the same 16-thread client (issue 15).

    .venv/bin/python benchmarks/crd_admission.py [--n 500] [--rounds 3] [--threads 16]
        [--variants generated,no-cel,no-schema,only-spec,...] [--workloads bench,full]
        [--out benchmarks/results/crd-admission]

Each variant is the CRD as `crdgen` generates it under its own API group (`<variant>.crdbench.kubetrain.io`),
so all are served at once by one API server:

- generated: as `crdgen` generates it from this checkout's models;
- baseline: the CRD file given with --baseline-crd (e.g. main's), for a before/after in one run, and
  baseline-only-<group>: that file with one group of rules;
- no-cel: the same schema without any x-kubernetes-validations rule;
- no-schema: no schema at all (x-kubernetes-preserve-unknown-fields at the root), the floor;
- only-<group>: the schema with one group of rules and no other (RULE_GROUPS says which rule is in which
  group, by where it sits and whether it is a transition rule).

JobSet's CRD (hack/build-peers.sh) is installed beside them, without its webhooks, and N JobSets of the
body peers.py submits are created in the same rounds: the reference of issue 15's target.

Workloads: `bench` is the TrainingJob peers.py and operator_scale.py submit (image, workers, trainer,
podAnnotations: what the target is about); `full` sets every field a rule checks (env with valueFrom,
resources with a GPU, two storage volumes, tolerations, nodeSelector, podLabels, failurePolicy,
command and args), so every rule runs. After creating, each object's status is patched once (merge patch on
the status subresource, as the operator writes it): every spec rule, transition rules included, runs again
on each status write.

Per (variant, workload, round): the wall seconds for the N requests, the API server's CPU seconds over them
(/proc), and the growth of its CEL timer (apiserver_cel_evaluation_duration_seconds_sum, from /metrics:
wall time, and each nested schema node's time is counted again at every node above it, so it only ranks
variants of one run). Order alternates between rounds. The machine is shared: the API server's CPU
seconds are the figure to compare; wall time moves with whatever else runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

import operator_scale  # noqa: E402
import peers  # noqa: E402
from kubetrain_operator import api  # noqa: E402
from kubetrain_operator.api import constants, crdgen  # noqa: E402
from testcluster import waiting  # noqa: E402
from testcluster.cluster import Cluster, start_cluster  # noqa: E402

BENCH_GROUP = "crdbench.kubetrain.io"
Rule = tuple[str, dict[str, Any]]
"""(where the rule sits, e.g. .spec.resources.limits, the rule) as found in the generated schema."""


def _group_of(path: str, rule: dict[str, Any]) -> str:
    if "oldSelf" in rule["rule"]:
        return "transition"
    if path == ".spec":
        return "spec"
    for prefix, group in (
        (".spec.image", "image"),
        (".spec.podAnnotations", "metadata-keys"),
        (".spec.podLabels", "metadata-keys"),
        (".spec.nodeSelector", "metadata-keys"),
        (".spec.resources", "resources"),
        (".spec.env", "env"),
        (".spec.storage", "storage"),
    ):
        if path.startswith(prefix):
            return group
    return "other"


RULE_GROUPS = ("spec", "transition", "image", "metadata-keys", "resources", "env", "storage", "other")
VARIANTS = ("generated", "no-cel", "no-schema", *(f"only-{g}" for g in RULE_GROUPS), "jobset")


def _walk(node: Any, path: str, visit: Any) -> None:
    """Call visit(path, node) on every schema node under `node`."""
    if not isinstance(node, dict):
        return
    visit(path, node)
    for key, child in (node.get("properties") or {}).items():
        _walk(child, f"{path}.{key}", visit)
    if isinstance(node.get("items"), dict):
        _walk(node["items"], f"{path}[]", visit)
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}{{}}", visit)
    for branch in [*node.get("anyOf", ()), *node.get("allOf", ())]:
        _walk(branch, path, visit)


def rules(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """(group, rule text) of every rule of a schema."""
    found: list[tuple[str, str]] = []
    _walk(
        schema,
        "",
        lambda path, node: found.extend(
            (_group_of(path, r), r["rule"]) for r in node.get("x-kubernetes-validations", ())
        ),
    )
    return found


def variant_crd(variant: str, baseline: Path | None = None) -> dict[str, Any]:
    """The generated CRD (for `baseline`, the CRD file given) under this variant's group, with only the
    rules the variant keeps."""
    from_file = variant.split("-", 1)[0] == "baseline"
    crd = yaml.safe_load(baseline.read_text()) if from_file and baseline else crdgen.crd()
    group = f"{variant}.{BENCH_GROUP}"
    crd["metadata"] = {"name": f"{constants.PLURAL}.{group}"}
    crd["spec"]["group"] = group
    crd["spec"]["names"].pop("shortNames", None)
    crd["spec"]["names"].pop("categories", None)
    version = crd["spec"]["versions"][0]
    if variant == "no-schema":
        version["schema"] = {
            "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        }
        version["subresources"] = {"status": {}}  # the scale subresource's paths need a schema
        version.pop("additionalPrinterColumns", None)
        return crd
    kept = variant.removeprefix("baseline").removeprefix("-")
    keep = None if kept in ("generated", "") else kept.removeprefix("only-")

    def strip(path: str, node: dict[str, Any]) -> None:
        if "x-kubernetes-validations" not in node:
            return
        kept = [r for r in node["x-kubernetes-validations"] if _group_of(path, r) == keep or keep is None]
        if kept:
            node["x-kubernetes-validations"] = kept
        else:
            del node["x-kubernetes-validations"]

    _walk(version["schema"]["openAPIV3Schema"], "", strip)
    return crd


def bench_spec() -> dict[str, Any]:
    return peers.trainingjob("x", 4, "2s")["spec"]


def full_spec() -> dict[str, Any]:
    """A TrainingJob setting every field a CRD rule checks (valid: every rule passes)."""
    return {
        "image": "registry.example.com:5000/team/train:1.0",
        "imagePullPolicy": "IfNotPresent",
        "workers": 4,
        "nprocPerWorker": 2,
        "command": ["python", "train.py"],
        "args": ["--epochs", "3"],
        "launcher": "torchrun",
        "env": [
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "DATA_DIR", "value": "/data/cifar10"},
            {
                "name": "MEM_MB",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            },
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub-token", "key": "token"}}},
        ],
        "resources": {
            "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 2},
            "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 2},
        },
        "storage": [
            {
                "name": "data",
                "mountPath": "/data",
                "subPath": "cifar10",
                "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True},
            },
            {"name": "scratch", "mountPath": "/scratch", "emptyDir": {"sizeLimit": "10Gi"}},
        ],
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "spot",
                "operator": "Equal",
                "value": "true",
                "effect": "NoExecute",
                "tolerationSeconds": 60,
            },
        ],
        "nodeSelector": {"cloud.example.com/gpu": "a100", "topology.kubernetes.io/zone": "eu-west-1a"},
        "podLabels": {"team": "vision", "app.kubernetes.io/part-of": "research"},
        "podAnnotations": {"sim.kubetrain.io/run-for": "2s", "example.com/owner": "vision-team"},
        "failurePolicy": {"retryableExitCodes": [137, 143], "nonRetryableExitCodes": [2, 3]},
    }


WORKLOADS = {"bench": bench_spec, "full": full_spec}
STATUS = {
    "phase": "Running",
    "observedGeneration": 1,
    "restarts": 0,
    "restartAttempt": 0,
    "conditions": [
        {
            "type": "Running",
            "status": "True",
            "reason": "AllWorkersRunning",
            "message": "4 of 4 workers running",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ],
}
"""The status patched onto every object (what the operator writes when a job's workers run)."""


class ApiServer:
    """The API server's CPU seconds and CEL evaluation seconds so far."""

    def __init__(self, cluster: Cluster, client: operator_scale.Api) -> None:
        self.pid = cluster.pids["kube-apiserver"]
        self.client = client

    def sample(self) -> tuple[float, float]:
        cpu = operator_scale.proc_stats(self.pid)["cpu_seconds"]
        response = self.client.pool.request("GET", f"{self.client.server}/metrics", timeout=60)
        cel = 0.0
        for line in response.data.decode().splitlines():
            if line.startswith("apiserver_cel_evaluation_duration_seconds_sum"):
                cel = float(line.split()[-1])
        return cpu, cel


def timed(server: ApiServer, work: Any) -> dict[str, float]:
    cpu0, cel0 = server.sample()
    started = time.time()
    work()
    wall = time.time() - started
    cpu1, cel1 = server.sample()
    return {
        "wall_seconds": round(wall, 3),
        "apiserver_cpu_seconds": round(cpu1 - cpu0, 2),
        "cel_seconds": round(cel1 - cel0, 4),
    }


def run_one(
    client: operator_scale.Api, server: ApiServer, variant: str, workload: str, *, namespace: str, args: Any
) -> dict[str, Any]:
    if variant == "jobset":
        base = f"{peers.JOBSET_API}/namespaces/{namespace}/jobsets"
        bodies = [peers.jobset(f"j-{i:05d}", 4, "2s") for i in range(args.n)]
    else:
        base = f"/apis/{variant}.{BENCH_GROUP}/{constants.VERSION}/namespaces/{namespace}/{constants.PLURAL}"
        spec = WORKLOADS[workload]()
        bodies = [
            {
                "apiVersion": f"{variant}.{BENCH_GROUP}/{constants.VERSION}",
                "kind": constants.KIND,
                "metadata": {"name": f"j-{i:05d}"},
                "spec": copy.deepcopy(spec),
            }
            for i in range(args.n)
        ]
    out = {"create": timed(server, lambda: peers.create_all(client, base, bodies, args.threads))}
    if variant != "jobset":
        names = [b["metadata"]["name"] for b in bodies]

        def patch_all() -> None:
            import concurrent.futures

            def patch(name: str) -> None:
                response = client.pool.request(
                    "PATCH",
                    f"{client.server}{base}/{name}/status",
                    body=json.dumps({"status": STATUS}).encode(),
                    headers={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
                    timeout=60,
                )
                if response.status != 200:
                    raise RuntimeError(f"status patch {name}: {response.status} {response.data[:300]!r}")

            with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
                list(pool.map(patch, names))

        out["status_patch"] = timed(server, patch_all)
    return out


def install(cluster: Cluster, variants: list[str], baseline: Path | None) -> None:
    documents = [variant_crd(v, baseline) for v in variants if v != "jobset"]
    cluster.kubectl("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump_all(documents))
    names = [d["metadata"]["name"] for d in documents]
    if "jobset" in variants:
        cluster.kubectl(
            "apply", "--server-side", "-f", str(peers.jobset_dir() / "crd" / "jobset.x-k8s.io_jobsets.yaml")
        )
        names.append("jobsets.jobset.x-k8s.io")
    waiting.wait_for(
        lambda: (
            cluster.run_kubectl(
                "wait", "--for=condition=Established", "--timeout=10s", *(f"crd/{n}" for n in names)
            ).returncode
            == 0
        ),
        "the CRDs to be Established",
        timeout=120,
        interval=1.0,
    )


def summarise(rounds: list[dict[str, Any]], variants: list[str], workloads: list[str]) -> dict[str, Any]:
    """Medians over rounds; ratios to no-cel (what the rules cost) and, for creation, to JobSet."""
    out: dict[str, Any] = {}
    for workload in workloads:
        for phase in ("create", "status_patch"):
            for metric in ("wall_seconds", "apiserver_cpu_seconds", "cel_seconds"):
                for variant in variants:
                    key = "bench" if variant == "jobset" else workload
                    values = [
                        r[variant][key][phase][metric] for r in rounds if phase in r[variant].get(key, {})
                    ]
                    if values:
                        out.setdefault(workload, {}).setdefault(phase, {}).setdefault(metric, {})[variant] = (
                            round(statistics.median(values), 4)
                        )
    ratios: dict[str, Any] = {}
    if "jobset" in variants and "generated" in variants:
        per_round = [
            r["generated"]["bench"]["create"]["wall_seconds"] / r["jobset"]["bench"]["create"]["wall_seconds"]
            for r in rounds
        ]
        ratios["create_bench_generated_over_jobset_wall"] = {
            "per_round": [round(x, 3) for x in per_round],
            "median": round(statistics.median(per_round), 3),
        }
    out["ratios"] = ratios
    return out


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    a = results["args"]
    lines = [
        f"N = {a['n']} per variant and workload, {a['rounds']} rounds, {a['threads']} client threads. "
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory']}, load average at start "
        f"{' '.join(m['loadavg_at_start'])}; load during the rounds: {results['loadavg_per_round']}.",
        "",
        "Rules per group (generated CRD): "
        + ", ".join(f"{g} {n}" for g, n in results["rules_per_group"].items())
        + f"; total {sum(results['rules_per_group'].values())}.",
        "",
        "CEL timer: the growth of apiserver_cel_evaluation_duration_seconds_sum, wall time, counted again at "
        "every schema node above the one evaluating (the API server times each nested validate call): "
        "compare it between variants of one run only. The API server's CPU seconds are the cost.",
        "",
    ]
    summary = results["summary"]
    for workload in a["workloads"].split(","):
        for phase in ("create", "status_patch"):
            table = summary.get(workload, {}).get(phase)
            if not table:
                continue
            lines += [
                f"{workload}, {phase} (medians over rounds):",
                "",
                "| variant | wall s | API server CPU s | CEL timer s |",
                "|---|---|---|---|",
            ]
            for variant in table["wall_seconds"]:
                if variant == "jobset" and workload != "bench":
                    continue
                lines.append(
                    f"| {variant} | {table['wall_seconds'][variant]:.2f} | "
                    f"{table['apiserver_cpu_seconds'][variant]:.2f} | {table['cel_seconds'][variant]:.3f} |"
                )
            lines.append("")
    for key, value in summary["ratios"].items():
        lines.append(f"{key}: per round {value['per_round']}, median {value['median']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--workloads", default="bench,full")
    parser.add_argument(
        "--baseline-crd",
        type=Path,
        help="variant `baseline`: this CRD file (e.g. main's) beside the generated one",
    )
    parser.add_argument("--machine-note", default="")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "crd-admission")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    workloads = args.workloads.split(",")
    if any(v.startswith("baseline") for v in variants) and args.baseline_crd is None:
        parser.error("variant baseline needs --baseline-crd")
    for workload in workloads:  # both bodies must be valid TrainingJobs, or the figures measure refusals
        api.TrainingJobSpec.model_validate(WORKLOADS[workload]())
    counts: dict[str, int] = {g: 0 for g in RULE_GROUPS}
    for group, _ in rules(crdgen.openapi_schema()):
        counts[group] += 1
    results: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {**operator_scale.host(), "note": args.machine_note},
        "rules_per_group": counts,
        "loadavg_per_round": [],
        "rounds": [],
    }
    cluster = start_cluster(nodes=0, directory=Path(tempfile.mkdtemp(prefix="kubetrain-crdbench-")))
    try:
        install(cluster, variants, args.baseline_crd)
        client = operator_scale.Api(cluster.kubeconfig, maxsize=args.threads)
        server = ApiServer(cluster, client)
        # The API server builds a CRD's storage and compiles its rules on the first request to it: once per
        # variant here, outside the timed rounds (it is a cost of installing, not of admitting).
        warm = argparse.Namespace(n=2, threads=2)
        for variant in variants:
            namespace = f"warm-{variant}"
            operator_scale.namespace(client, namespace)
            run_one(client, server, variant, workloads[0], namespace=namespace, args=warm)
        for index in range(args.rounds):
            order = variants if index % 2 == 0 else variants[::-1]
            results["loadavg_per_round"].append(round(os.getloadavg()[0], 1))
            print(f"round {index} (load {os.getloadavg()[0]:.1f})", flush=True)
            runs: dict[str, Any] = {}
            for variant in order:
                for workload in ["bench"] if variant == "jobset" else workloads:
                    namespace = f"r{index}-{variant}-{workload}"
                    operator_scale.namespace(client, namespace)
                    time.sleep(1.0)  # the namespace's admission caches
                    run = run_one(client, server, variant, workload, namespace=namespace, args=args)
                    runs.setdefault(variant, {})[workload] = run
                    print(f"  {variant:22s} {workload:5s} {json.dumps(run)}", flush=True)
            results["rounds"].append(runs)
            results["summary"] = summarise(results["rounds"], variants, workloads)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
            args.out.with_suffix(".generated.md").write_text(render(results))
    finally:
        cluster.stop()
    print(render(results))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
