"""Names and label values of a TrainingJob's children, valid and unique for any TrainingJob name.

A TrainingJob name is a DNS subdomain (up to 253 characters, dots allowed, may start with a digit), but:

- the Service name must be a DNS-1035 label (<= 63 characters, starts with a letter, no dots);
- a Job name ends up in label values on its pods, so it must fit 63 characters, and the pod hostname
  (set to the Job name) must be a DNS-1123 label;
- label values must fit 63 characters.

So every child name starts with one *base*: the TrainingJob name itself when it is already a DNS-1035
label of at most 50 characters, otherwise a sanitised prefix plus an 8-hex-digit hash of the full name
(so two long names sharing a prefix, or `a.b` and `a-b`, never collide). Formats:

- Service: `<base>`;
- worker Job and pod hostname: `<base>-r<restartAttempt>-w<index>`, at most 63 characters for
  restartAttempt <= 1000 and index < 4096; worker DNS: `<base>-r<N>-w<i>.<base>.<namespace>.svc`;
- gang-scheduling group objects (see gang): `<base>` (the Workload, and the PodGroup of volcano and
  scheduler-plugins), `<base>-r<restartAttempt>` (a kubernetes PodGroup, one per attempt);
- label `kubetrain.io/job-name`: the TrainingJob name when it fits 63 characters, else a prefix plus hash.
"""

from __future__ import annotations

import hashlib
import re

from kubetrain_operator.api import policies

MAX_LABEL = 63
HASH_LEN = 8
MAX_SUFFIX = len(f"-r{policies.MAX_RESTARTS + 1_000_000}-w{policies.MAX_WORKERS - 1}")
"""Longest child suffix: room for restart attempts well beyond maxRestarts (suspend/resume cycles)."""
MAX_BASE = MAX_LABEL - MAX_SUFFIX

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LEN]


def is_dns1035_label(text: str) -> bool:
    return len(text) <= MAX_LABEL and bool(_DNS1035.match(text))


def is_dns1123_label(text: str) -> bool:
    return len(text) <= MAX_LABEL and bool(_DNS1123_LABEL.match(text))


def is_label_value(text: str) -> bool:
    return len(text) <= MAX_LABEL and bool(_LABEL_VALUE.match(text))


def base(job_name: str) -> str:
    """The prefix of every child name: a DNS-1035 label of at most MAX_BASE characters."""
    if len(job_name) <= MAX_BASE and _DNS1035.match(job_name):
        return job_name
    cleaned = re.sub(r"[^a-z0-9-]", "-", job_name.lower())
    if not cleaned[:1].isalpha():
        cleaned = "tj-" + cleaned
    keep = MAX_BASE - HASH_LEN - 1
    prefix = re.sub(r"-+", "-", cleaned[:keep]).rstrip("-")
    return f"{prefix}-{short_hash(job_name)}"


def service_name(job_name: str) -> str:
    """The headless Service: `<base>`."""
    return base(job_name)


def worker_job_name(job_name: str, restart_attempt: int, index: int) -> str:
    """Worker `index`'s Job in `restart_attempt`; also the pod's hostname: `<base>-r<attempt>-w<index>`."""
    return f"{base(job_name)}-r{restart_attempt}-w{index}"


def attempt_pod_group_name(job_name: str, restart_attempt: int) -> str:
    """The PodGroup of one restart attempt's workers (provider kubernetes): `<base>-r<attempt>`."""
    return f"{base(job_name)}-r{restart_attempt}"


def worker_hostname(job_name: str, restart_attempt: int, index: int) -> str:
    return worker_job_name(job_name, restart_attempt, index)


def worker_dns(job_name: str, namespace: str, restart_attempt: int, index: int) -> str:
    """Worker `index`'s stable DNS name: `<hostname>.<service>.<namespace>.svc`."""
    return f"{worker_hostname(job_name, restart_attempt, index)}.{service_name(job_name)}.{namespace}.svc"


def job_label_value(job_name: str) -> str:
    """Value of the kubetrain.io/job-name label: the name itself when it fits, else prefix + hash."""
    if len(job_name) <= MAX_LABEL:
        return job_name
    prefix = job_name[: MAX_LABEL - HASH_LEN - 1].rstrip("-.")
    return f"{prefix}-{short_hash(job_name)}"


def rendezvous_job_name(job_name: str, generation: int = 0) -> str:
    """The elastic rendezvous store's Job, also its pod's hostname: `<base>-rdzv` for the first store,
    `<base>-rdzv-g<generation>` for each one after a store was lost, so a new store never waits for
    the name of one stuck on a lost node."""
    return f"{base(job_name)}-rdzv" + (f"-g{generation}" if generation else "")


def rendezvous_dns(job_name: str, namespace: str, generation: int = 0) -> str:
    """The rendezvous store's stable DNS name: `<store job>.<service>.<namespace>.svc`."""
    return f"{rendezvous_job_name(job_name, generation)}.{service_name(job_name)}.{namespace}.svc"
