"""Developer command: `python -m testcluster up|down|status|demo|push-images|build-in-background`
(PYTHONPATH=tests; see the Makefile).

`up` starts a detached cluster whose state lives in a fixed directory and prints the KUBECONFIG to
export; `down` stops every process it started and deletes the directory. `demo` (`make demo-cluster`)
starts a one-node cluster with real containers, installs the chart, runs examples/cifar10-cpu.yaml on it
while streaming `kubectl get tj -w`, and keeps the cluster up until Enter or Ctrl-C. `push-images`
(`make node-images`) builds the operator and trainer images with podman and pushes them into the real-node
cluster's registry storage, where its node pulls them from. `build-in-background` (run by `make test`
before its builds) starts the builds tests otherwise run on first use (the registry, promtool,
actionlint, the oldest control plane, Kueue) at the lowest CPU priority and returns at once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from testcluster import binaries, quickstart, registry
from testcluster.cluster import Cluster, start_cluster
from testcluster.node import build_images, real_node_cluster

DEFAULT_DIR = Path(
    os.environ.get("KUBETRAIN_DEV_CLUSTER_DIR", Path.home() / ".cache" / "kubetrain" / "dev-cluster")
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testcluster", description=__doc__)
    parser.add_argument(
        "command", choices=["up", "down", "status", "demo", "push-images", "build-in-background"]
    )
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory (default %(default)s)")
    parser.add_argument("--nodes", type=int, default=3, help="number of kwok nodes (default %(default)s)")
    args = parser.parse_args(argv)
    state = args.dir / "state.json"

    if args.command == "demo":
        return demo()
    if args.command == "push-images":
        return push_images()
    if args.command == "build-in-background":
        builds = binaries.start_background_builds()
        print(
            f"[build-in-background] pid {builds.pid}, nice 19, log {binaries.BACKGROUND_BUILD_LOG}",
            file=sys.stderr,
        )
        return 0
    if args.command == "up":
        if state.exists():
            print(
                f"a dev cluster is already up in {args.dir}; run `make cluster-down` first", file=sys.stderr
            )
            return 1
        cluster = start_cluster(nodes=args.nodes, detached=True, directory=args.dir)
        print(cluster.kubectl("get", "nodes"), file=sys.stderr)
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        print(f"export PATH={cluster.bin_dir}:$PATH")
        return 0
    if not state.exists():
        print(f"no dev cluster in {args.dir}", file=sys.stderr)
        return 0 if args.command == "down" else 1
    cluster = Cluster.from_state(args.dir)
    if args.command == "status":
        for name, alive in cluster.alive().items():
            print(f"{name:26} {'running' if alive else 'DEAD'}")
        print(f"KUBECONFIG={cluster.kubeconfig}")
        return 0 if all(cluster.alive().values()) else 1
    cluster.stop()
    print(f"dev cluster in {args.dir} stopped and removed", file=sys.stderr)
    return 0


def push_images() -> int:
    """Build (or find cached) both images and push them into the test cluster's registry storage."""
    with tempfile.TemporaryDirectory(prefix="kubetrain-push-") as work_dir:
        for reference, digest in registry.push_to_storage(build_images(), Path(work_dir)).items():
            print(f"{reference} -> {registry.STORAGE} as {registry.repository(reference)}@{digest}")
    return 0


DEMO_DIR = binaries.REPO_ROOT / "runs" / "demo-cluster"
DEMO_NAMESPACE = "default"


def demo() -> int:
    """The quickstart on a real node, as the README tells it, with the CPU example."""
    example = binaries.REPO_ROOT / "examples" / "cifar10-cpu.yaml"
    with real_node_cluster() as (cluster, node):
        print(
            f"== cluster up; export KUBECONFIG={cluster.kubeconfig} PATH={cluster.bin_dir}:$PATH", flush=True
        )
        data = quickstart.extract_sample(DEMO_DIR / "data")
        quickstart.prepare_namespace(cluster, DEMO_NAMESPACE, data, DEMO_DIR / "output")
        print(
            f"== helm install kubetrain {registry.CHART} -n kubetrain-system --create-namespace", flush=True
        )
        quickstart.helm_install(cluster, node.registry, [DEMO_NAMESPACE])
        print(cluster.kubectl("-n", quickstart.RELEASE_NAMESPACE, "get", "pods"), flush=True)
        print(f"== kubectl apply -f {example.relative_to(binaries.REPO_ROOT)}", flush=True)
        cluster.kubectl("-n", DEMO_NAMESPACE, "apply", "-f", str(example))
        print("== kubectl get trainingjobs -w", flush=True)
        kubectl = [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
        watch = subprocess.Popen([*kubectl, "-n", DEMO_NAMESPACE, "get", "trainingjobs", "-w"])
        try:
            cluster.kubectl(
                "-n",
                DEMO_NAMESPACE,
                "wait",
                "tj/cifar10-cpu",
                "--timeout=1800s",
                "--for=jsonpath={.status.phase}=Succeeded",
            )
        finally:
            watch.terminate()
            watch.wait()
        print(f"== artifacts in {DEMO_DIR / 'output' / 'cifar10-cpu'}:", flush=True)
        for artifact in sorted((DEMO_DIR / "output" / "cifar10-cpu").iterdir()):
            print(f"   {artifact.name}")
        if sys.stdin.isatty():
            print("== the cluster stays up for you: press Enter (or Ctrl-C) to tear it all down", flush=True)
            with contextlib.suppress(KeyboardInterrupt, EOFError):
                input()
    print("== torn down: processes, network namespace, cgroups and the cluster's files are gone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
