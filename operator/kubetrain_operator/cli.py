"""`kubetrain`: one entry point for the operator, the CRD generator and the trainer.

    kubetrain operator [--namespace NS ...|--all-namespaces] [--default-image IMG] [--metrics-port N]
                       [--worker-service-account SA [--worker-cluster-role CLUSTERROLE]]
                       [--liveness URL] [--leader-elect] [--no-kueue]
                       [--verbose] [--log-format plain|full|json]
                       [--allowed-volume-types TYPE,...] [--allowed-service-accounts NAME,...]
    kubetrain crds [--check] [--root DIR]
    kubetrain validate -f MANIFEST.yaml [-f ...]
    kubetrain train|evaluate|predict ...   (the trainer, see kubetrain_trainer.cli)
    kubetrain run -f TRAININGJOB.yaml --local [--mount NAME=DIR ...] [--workdir DIR]
    kubetrain artifacts tj/NAME [-n NS] --to DIR [--checkpoints] [--unfinished] [--image IMG]

The trainer subcommands are delegated before argparse sees them, with argv starting at the subcommand
word, and import the trainer lazily so the operator never imports torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

TRAINER_COMMANDS = ("train", "evaluate", "predict")


def _comma_list(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def _volume_types(value: str) -> list[str]:
    from kubetrain_operator.planning.admission import VOLUME_TYPES

    names = _comma_list(value)
    unknown = [name for name in names if name not in VOLUME_TYPES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown volume type {', '.join(unknown)} (known: {', '.join(VOLUME_TYPES)})"
        )
    return names


def _parser() -> argparse.ArgumentParser:
    from kubetrain_operator.runtime.main import LOG_FORMATS, Options

    try:
        env = Options.from_env()  # the flags' defaults
    except ValueError as exc:
        sys.exit(f"kubetrain: {exc}")
    parser = argparse.ArgumentParser(prog="kubetrain", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    op = sub.add_parser("operator", help="run the TrainingJob operator")
    scope = op.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        default=None,
        help="namespace (or glob pattern) to watch; repeatable. Env KUBETRAIN_NAMESPACES (comma-separated). "
        "Default: $POD_NAMESPACE or 'default'.",
    )
    scope.add_argument(
        "--all-namespaces",
        "-A",
        action="store_true",
        default=env.all_namespaces,
        help="watch every namespace",
    )
    op.add_argument(
        "--default-image",
        default=env.default_image,
        help="image for TrainingJobs without spec.image (env KUBETRAIN_DEFAULT_IMAGE; default: %(default)s, "
        "built from Dockerfile.trainer by `make images`)",
    )
    op.add_argument(
        "--worker-service-account",
        default=env.worker_service_account,
        help="ServiceAccount for workers of TrainingJobs without spec.serviceAccountName "
        "(env KUBETRAIN_WORKER_SERVICE_ACCOUNT; default: the namespace's default account, whose workers "
        "cannot report progress)",
    )
    op.add_argument(
        "--worker-cluster-role",
        default=env.worker_cluster_role,
        metavar="CLUSTERROLE",
        help="create --worker-service-account, bound to this ClusterRole, in each namespace where workers "
        "run (env KUBETRAIN_WORKER_CLUSTER_ROLE; the chart's <release>-worker when watching all namespaces; "
        "default: create nothing)",
    )
    op.add_argument(
        "--allowed-volume-types",
        type=_volume_types,
        default=env.allowed_volume_types,
        metavar="TYPE,...",
        help="the spec.storage volume sources TrainingJobs may use, from persistentVolumeClaim, hostPath, "
        "emptyDir (env KUBETRAIN_ALLOWED_VOLUME_TYPES; default: all; empty: none)",
    )
    op.add_argument(
        "--allowed-service-accounts",
        type=_comma_list,
        default=env.allowed_service_accounts,
        metavar="NAME,...",
        help="the spec.serviceAccountName values TrainingJobs may use; a job naming none always may "
        "(env KUBETRAIN_ALLOWED_SERVICE_ACCOUNTS; default: any; empty: none)",
    )
    op.add_argument("--metrics-port", type=int, default=env.metrics_port, help="Prometheus port; 0 disables")
    op.add_argument(
        "--liveness",
        default=env.liveness or "",
        help="liveness endpoint URL, e.g. http://0.0.0.0:8081/healthz",
    )
    op.add_argument("--workers", type=int, default=env.workers, help="reconcile threads (default 16)")
    op.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    op.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=env.log_format,
        help="full (default: timestamps and logger names, as kopf writes them), plain (messages only) or "
        "json (one object per line, for log pipelines)",
    )
    op.add_argument(
        "--leader-elect",
        action="store_true",
        default=env.leader_elect,
        help="run only while holding a coordination.k8s.io Lease (the HA mode for several replicas)",
    )
    op.add_argument(
        "--leader-election-namespace",
        default=env.leader_election_namespace,
        help="namespace of the Lease (default: $POD_NAMESPACE or 'default')",
    )
    op.add_argument("--leader-election-id", default=env.leader_election_id, help="name of the Lease")
    op.add_argument(
        "--no-kueue",
        dest="kueue",
        action="store_false",
        default=env.kueue,
        help="never use Kueue, even where its Workload API is served (for RBAC without Kueue's objects)",
    )
    op.add_argument(
        "--resync-seconds",
        type=float,
        default=env.resync_seconds,
        help="reconcile unfinished jobs this often",
    )

    crds = sub.add_parser(
        "crds", help="generate the CRD and docs/api-reference.md from the API models (or --check for drift)"
    )
    crds.add_argument("--check", action="store_true", help="fail when a checked-in generated file differs")
    crds.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: cwd)")
    crds.add_argument("--stdout", action="store_true", help="print the CRD instead of writing files")

    validate = sub.add_parser(
        "validate",
        help="check TrainingJob manifests with the API's models, no cluster needed",
        description="Check every TrainingJob document of each file with the models the CRD is generated "
        "from, naming the file, the document and the field of each problem; documents of other kinds are "
        "listed and skipped. Exit 0 when every TrainingJob is valid, 1 otherwise.",
    )
    validate.add_argument(
        "-f", "--filename", type=Path, action="append", required=True, help="manifest (YAML); repeatable"
    )

    for name in TRAINER_COMMANDS:
        sub.add_parser(name, help=f"trainer: {name} (see `kubetrain {name} --help`)", add_help=False)
    run = sub.add_parser(
        "run",
        help="run a TrainingJob's workers as local processes (--local), no cluster needed",
        description="Render the TrainingJob's worker pods with the operator's builders and run each "
        "container command locally with exactly that env (master on loopback), restarting the group "
        "as the operator would; prints the final status. Each spec.storage volume is a local directory: "
        "--mount NAME=DIR, else a hostPath's own path, else WORKDIR/NAME (runs/data, runs/output for the "
        "examples). When the built-in trainer's data.root does not exist there and an archive "
        "data/<root name>.tar.gz sits beside the manifest (examples/data/cifar10-sample.tar.gz), it is "
        "extracted first, so `kubetrain run -f examples/cifar10-cpu.yaml --local` needs no flags.",
    )
    run.add_argument("-f", "--filename", type=Path, required=True, help="TrainingJob manifest (YAML)")
    run.add_argument("--local", action="store_true", required=True, help="run here (the only mode)")
    run.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="local directory for spec.storage volume NAME (default: hostPath's path or WORKDIR/NAME)",
    )
    run.add_argument(
        "--workdir",
        type=Path,
        default=Path("runs"),
        help="where volumes without --mount live (default: runs)",
    )
    _add_artifacts_parser(sub)
    return parser


def _add_artifacts_parser(sub: argparse._SubParsersAction) -> None:
    artifacts = sub.add_parser(
        "artifacts",
        help="copy a finished job's output directory (model.pt, metrics.json, plots) to this machine",
        description="Copy <spec.trainer.output_dir>/<job>/ off the persistentVolumeClaim that spec.storage "
        "mounts there into DIR, through a short-lived pod mounting the claim read-only (restricted Pod "
        "Security) and a tar streamed out by the API's exec: the kubeconfig is all it needs, not kubectl. "
        "The pod is deleted whatever happens (also on Ctrl-C). checkpoints/ is left out unless "
        "--checkpoints. Entries of DIR with the names copied are replaced. Exit 0 copied, 1 failed, 2 "
        "refused (job not finished, command job, output on no claim).",
    )
    artifacts.add_argument("job", metavar="tj/NAME", help="the TrainingJob (tj/NAME or NAME)")
    artifacts.add_argument(
        "-n", "--namespace", help="its namespace (default: the kubeconfig context's namespace)"
    )
    artifacts.add_argument("--to", type=Path, required=True, metavar="DIR", help="where to put the files")
    artifacts.add_argument(
        "--checkpoints",
        action="store_true",
        help="copy checkpoints/ as well (left out by default: one checkpoint per epoch kept, each as "
        "large as the model and its optimizer state)",
    )
    artifacts.add_argument(
        "--unfinished",
        action="store_true",
        help="copy from a job that is not Succeeded or Failed yet: what it has written so far (whole "
        "files only; model.pt comes at the end)",
    )
    artifacts.add_argument(
        "--image",
        help="the helper pod's image, which needs python3 (default: the job's spec.image, else "
        "the trainer image)",
    )
    artifacts.add_argument(
        "--start-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long the helper pod may take to start, image pull included (default: %(default)s)",
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TRAINER_COMMANDS:
        from kubetrain_trainer import cli as trainer_cli  # lazy: imports torch

        return int(trainer_cli.main(argv) or 0)

    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "operator" and args.worker_cluster_role and not args.worker_service_account:
        parser.error("--worker-cluster-role needs --worker-service-account: the account it binds the role to")
    if args.command == "crds":
        from kubetrain_operator.api import apidocs, crdgen

        if args.stdout:
            sys.stdout.write(crdgen.render())
            return 0
        if args.check:
            stale = crdgen.drifted(args.root) + apidocs.drifted(args.root)
            for path in stale:
                print(f"out of date: {path} (run `kubetrain crds`)", file=sys.stderr)
            return 1 if stale else 0
        for path in [*crdgen.write(args.root), apidocs.write(args.root)]:
            print(f"wrote {path}")
        return 0
    if args.command == "operator":
        from kubetrain_operator.runtime.main import Options, run

        options = Options.from_args(args)
        run(options)
        return 0
    if args.command == "validate":
        from kubetrain_operator.local import manifests

        return manifests.validate(args.filename)
    if args.command == "run":
        from kubetrain_operator.local import command

        return command.main(args.filename, args.mount, args.workdir)
    if args.command == "artifacts":
        from kubetrain_operator.remote import copying

        return copying.copy(
            args.job,
            args.to,
            namespace=args.namespace,
            checkpoints=args.checkpoints,
            unfinished=args.unfinished,
            image=args.image,
            start_timeout=args.start_timeout,
        )
    return 2


if __name__ == "__main__":
    sys.exit(main())
