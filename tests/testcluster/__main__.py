"""Developer command: `python -m testcluster up|down|status` (run with PYTHONPATH=tests; see the Makefile).

`up` starts a detached cluster whose state lives in a fixed directory and prints the KUBECONFIG to
export; `down` stops every process it started and deletes the directory.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from testcluster.cluster import Cluster, start_cluster

DEFAULT_DIR = Path(
    os.environ.get("KUBETRAIN_DEV_CLUSTER_DIR", Path.home() / ".cache" / "kubetrain" / "dev-cluster")
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testcluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory (default %(default)s)")
    parser.add_argument("--nodes", type=int, default=3, help="number of kwok nodes (default %(default)s)")
    args = parser.parse_args(argv)
    state = args.dir / "state.json"

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


if __name__ == "__main__":
    sys.exit(main())
