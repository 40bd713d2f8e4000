"""Finding, or building once, the control plane's binaries (see hack/build-k8s.sh)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-k8s.sh"
ACTIONLINT_BUILD_SCRIPT = REPO_ROOT / "hack" / "build-actionlint.sh"
PROMTOOL_BUILD_SCRIPT = REPO_ROOT / "hack" / "build-promtool.sh"
REGISTRY_BUILD_SCRIPT = REPO_ROOT / "hack" / "build-registry.sh"
KUEUE_BUILD_SCRIPT = REPO_ROOT / "hack" / "build-kueue.sh"
CACHE_ROOT = Path(os.environ.get("KUBETRAIN_CACHE", Path.home() / ".cache" / "kubetrain"))
"""Where builds are cached (binaries, images, the real node's image store), as hack/*.sh use it."""
KUBERNETES_VERSION = "v1.37.2"
"""The Kubernetes the suite's clusters run (hack/build-k8s.sh builds it by default; a test holds the two
equal), and the version offline chart renders (`helm template --kube-version`) stand for."""
OLDEST_KUBERNETES_VERSION = "v1.34.4"
"""The oldest Kubernetes the chart declares (Chart.yaml's kubeVersion, a test holds the minor equal):
the refusal table, a chart install and a TrainingJob's lifecycle also run on its control plane. 1.34 is
the first whose API server estimates the cost of CEL's quantity() and isQuantity() called as functions,
as the CRD's resource rules call them: 1.32 (run: the CRD is refused, its rules' estimated cost over the
budget 21.5 times) and 1.33 (read in its source) count each such call as unbounded. The newest 1.34
patch whose needed modules the module proxy serves."""
REQUIRED = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
    "kubelet",
    "kube-proxy",
    "coredns",
)


def ensure_binaries() -> Path:
    """Return the directory holding every binary, building what is missing (a no-op when cached)."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=sys.stderr, text=True, check=True
    )
    bin_dir = Path(result.stdout.strip().splitlines()[-1])
    missing = [name for name in REQUIRED if not (bin_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{BUILD_SCRIPT} finished but {', '.join(missing)} missing in {bin_dir}")
    return bin_dir


OLDEST_CONTROL_PLANE_BUILD = ("bash", str(BUILD_SCRIPT), "--control-plane-only", OLDEST_KUBERNETES_VERSION)


def ensure_oldest_control_plane() -> Path:
    """Return the directory holding kube-apiserver, kube-controller-manager and kube-scheduler of
    OLDEST_KUBERNETES_VERSION, building them once (about 15 minutes cold on 2 cores, then cached); the
    suite's etcd, kwok, kubectl and helm serve both versions."""
    result = subprocess.run(
        OLDEST_CONTROL_PLANE_BUILD,
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        check=True,
    )
    directory = Path(result.stdout.strip().splitlines()[-1])
    missing = [n for n in CONTROL_PLANE if not (directory / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{BUILD_SCRIPT} finished but {', '.join(missing)} missing in {directory}")
    return directory


CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
"""The binaries that make a cluster one Kubernetes version or another."""


def ensure_actionlint() -> Path:
    """Return the actionlint binary, building it alone if missing (about 15 s cold, nothing when cached).

    The workflow checks need only this one tool, not the control plane that `ensure_binaries` builds.
    """
    return _ensure_tool(ACTIONLINT_BUILD_SCRIPT, "actionlint")


def ensure_promtool() -> Path:
    """Return promtool, building it alone if missing (about four minutes cold on 2 busy cores, nothing
    when cached): the chart's alert rules are checked with it, which needs no control plane."""
    return _ensure_tool(PROMTOOL_BUILD_SCRIPT, "promtool")


def ensure_kueue() -> Path:
    """Return the directory holding Kueue's manager (kueue), its CRDs (crds/) and webhook configurations
    (webhooks.yaml), building them if missing (about four minutes cold on 2 cores, nothing when cached).

    Only the Kueue tests run it, so a cold suite starts without waiting for it."""
    directory = _ensure_tool(KUEUE_BUILD_SCRIPT, "kueue").parent
    for part in ("crds", "webhooks.yaml"):
        if not (directory / part).exists():
            raise FileNotFoundError(f"{KUEUE_BUILD_SCRIPT} finished but {directory / part} is missing")
    return directory


def ensure_registry() -> Path:
    """Return the container registry (Distribution's `registry`) the real node pulls from, building it
    alone if missing (252 s cold on 2 loaded cores, nothing when cached)."""
    return _ensure_tool(REGISTRY_BUILD_SCRIPT, "registry")


def _ensure_tool(script: Path, name: str) -> Path:
    """Run a build script that prints the directory holding `name` as its last line; return the binary."""
    result = subprocess.run(
        ["bash", str(script)],
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        check=True,
    )
    binary = Path(result.stdout.strip().splitlines()[-1]) / name
    if not binary.is_file():
        raise FileNotFoundError(f"{script} finished but {binary} is missing")
    return binary


ON_FIRST_USE_BUILDS: tuple[tuple[str, ...], ...] = (
    ("bash", str(REGISTRY_BUILD_SCRIPT)),
    ("bash", str(PROMTOOL_BUILD_SCRIPT)),
    ("bash", str(ACTIONLINT_BUILD_SCRIPT)),
    OLDEST_CONTROL_PLANE_BUILD,
    ("bash", str(KUEUE_BUILD_SCRIPT)),
)
"""The builds a test otherwise starts when it first needs the binary, in the order `make test` needs them:
the registry before pytest (`make node-images`), then the chart tests' promtool and oldest control plane,
then Kueue (its first test came 28 minutes into pytest in a cold run on 2 cores)."""
BACKGROUND_BUILD_LOG = CACHE_ROOT / "background-builds.log"


def start_background_builds(
    builds: Sequence[Sequence[str]] = ON_FIRST_USE_BUILDS, log: Path = BACKGROUND_BUILD_LOG
) -> subprocess.Popen[bytes]:
    """Run `builds` one after another in a detached session at the lowest CPU priority; return at once.

    Cold, these builds take about thirteen minutes of a 2-core machine where a test first needs them, while
    the foreground builds (single-threaded link steps, module downloads) and the waiting tests leave a core
    idle for much of `make test`: started first, they use that idle CPU instead. Each build script holds
    its own lock, so whoever needs a binary first waits for the build under way, then finds it cached; a
    background build that fails leaves the binary missing, and the test's own call builds it again and
    shows the error. Warm, each script finds its binary and exits at once.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    chain = "; ".join(shlex.join(build) for build in builds)
    with log.open("wb") as output:
        return subprocess.Popen(
            ["nice", "-n", "19", "bash", "-c", chain],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
