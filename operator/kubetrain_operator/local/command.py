"""`kubetrain run -f trainingjob.yaml --local`: read the manifest, prepare its directories, and run the
job's group here: `group_run` for a fixed-size group, `elastic_run` for spec.elastic."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from kubetrain_operator.local import elastic_run, group_run
from kubetrain_operator.local.processes import (
    LocalRunError,
    load_trainingjob,
    mount_directories,
    parse_mounts,
    plan_local_workers,
    provide_sample,
)


def main(manifest: Path, mounts: list[str], workdir: Path) -> int:
    """CLI body of `kubetrain run --local`: prints the final status like `kubectl get tj` would."""
    try:
        job = load_trainingjob(manifest)
        directories = mount_directories(job.spec, parse_mounts(mounts), workdir)
        plan_local_workers(job, directories, master_port=0)  # refuse untranslatable env before starting
    except LocalRunError as error:
        print(f"kubetrain run: {error}", file=sys.stderr)
        return 2
    extracted = provide_sample(job, directories, manifest)
    if extracted is not None:
        print(f"kubetrain: {extracted}")
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        if job.spec.elastic is not None:
            desired = elastic_run.manifest_workers(manifest, job.spec)
            result = elastic_run.run_local_elastic(job, directories, desired=desired)
        else:
            result = group_run.run_local(job, directories)
    finally:
        signal.signal(signal.SIGTERM, previous)
    name = job.metadata.get("name", "local")
    print(
        f"trainingjob/{name}: {result.phase} ({result.reason}) restarts={result.restarts}: {result.message}"
    )
    return result.exit_code
