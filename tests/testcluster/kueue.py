"""Kueue's manager, an unmodified release built by hack/build-kueue.sh, running beside a test control plane.

How it runs outside a cluster: with the test cluster's admin kubeconfig, leader election off, and its
webhook server on 127.0.0.1 with a serving pair of our own (internal cert management is off: it issues
certificates for a Service DNS name the API server cannot reach here). Kueue's own webhook
configurations are registered pointing at that address, so the API server runs Kueue's defaulting and
validation on Workloads, queues and Jobs exactly as in a cluster (only the webhooks of the kinds enabled
here: Kueue's objects and batch Jobs). TrainingJob is listed in integrations.externalFrameworks, as the
docs/kueue.md tells users to do.

One wrinkle: without internal cert management Kueue reads its metrics server's pair from the fixed path
/etc/kueue/metrics/certs even when metrics are off; any pair will do, so one is written there once.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from testcluster import binaries, pki, processes
from testcluster.cluster import Cluster
from testcluster.waiting import wait_for

NAMESPACE = "kueue-system"
EXTERNAL_FRAMEWORK = "TrainingJob.v1alpha1.kubetrain.io"
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
WEBHOOK_GROUPS = ("kueue.x-k8s.io", "batch")
"""The webhooks registered: Kueue's own objects and the one integration enabled (batch/job)."""


PODS_READY_TIMEOUT_SECONDS = 30
"""Kueue's waitForPodsReady timeout here: shorter than the jobs that must outlive it."""


def configuration(webhook_port: int, probe_port: int, cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [EXTERNAL_FRAMEWORK]},
        # As production installs run it: an admitted Workload whose PodsReady condition is not True within
        # the timeout is evicted. A TrainingJob passes only because the operator keeps that condition.
        "waitForPodsReady": {"timeout": f"{PODS_READY_TIMEOUT_SECONDS}s"},
        # The on-demand visibility API is an aggregated API server of its own, with certificates at the
        # fixed path /visibility: nothing here uses it.
        "featureGates": {"VisibilityOnDemand": False},
    }


def webhook_configurations(source: Path, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, each webhook pointed at https://127.0.0.1:<port><its path>."""
    import base64

    out = []
    for document in yaml.safe_load_all(source.read_text()):
        if not document:
            continue
        kept = []
        for hook in document.get("webhooks") or ():
            groups = {group for rule in hook.get("rules") or () for group in rule.get("apiGroups") or ()}
            if not groups & set(WEBHOOK_GROUPS):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
            kept.append(hook)
        if kept:
            document["metadata"]["name"] = f"kueue-{document['metadata']['name']}"
            document["webhooks"] = kept
            out.append(document)
    return out


def _ensure_metrics_certs() -> None:
    if not (METRICS_CERTS / "tls.crt").is_file():
        pki.create_serving_pair(METRICS_CERTS, "kueue-metrics")


@contextmanager
def running_kueue(cluster: Cluster, directory: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Install Kueue's CRDs and webhooks and run its manager until the block ends; the webhook
    configurations go first on the way out (a webhook whose server is gone fails every request)."""
    source = binaries.ensure_kueue()
    cluster.kubectl("apply", "--server-side", "-f", str(source / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "-f", str(source / "crds"), "--timeout=90s")
    cluster.kubectl("create", "namespace", NAMESPACE)
    directory.mkdir(parents=True, exist_ok=True)
    serving = pki.create_serving_pair(directory / "webhook-certs", "kueue-webhook")
    _ensure_metrics_certs()
    webhook_port, probe_port = processes.free_port(), processes.free_port()
    config = directory / "kueue-config.yaml"
    config.write_text(yaml.safe_dump(configuration(webhook_port, probe_port, serving.directory)))
    argv = [str(source / "kueue"), f"--config={config}", f"--kubeconfig={cluster.kubeconfig}"]
    process = processes.start("kueue", argv, directory, detached=False)
    hooks = webhook_configurations(source / "webhooks.yaml", webhook_port, serving.ca_cert.read_bytes())
    try:
        wait_for(
            lambda: process.poll() is not None or _ready(probe_port),
            "Kueue to be ready",
            timeout=120,
            explain=lambda: _log_tail(directory),
        )
        if process.poll() is not None:
            raise RuntimeError(f"kueue exited with {process.returncode}:\n{_log_tail(directory)}")
        cluster.kubectl(
            "apply", "-f", "-", input_text=json.dumps({"kind": "List", "apiVersion": "v1", "items": hooks})
        )
        yield process
    finally:
        for hook in hooks:
            kind = hook["kind"].lower()
            cluster.run_kubectl("delete", kind, hook["metadata"]["name"], "--ignore-not-found")
        processes.stop_group(process.pid)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as answer:
            return answer.status == 200
    except OSError:
        return False


def _log_tail(directory: Path, lines: int = 40) -> str:
    log = directory / "kueue.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    return "kueue log:\n" + "\n".join(text.splitlines()[-lines:])
