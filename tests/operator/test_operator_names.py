"""Child names are valid Kubernetes names and unique, for every TrainingJob name length and shape."""

from __future__ import annotations

import pytest
from kubetrain_operator import api
from kubetrain_operator.api import names

pytestmark = pytest.mark.unit

LONGEST_ATTEMPT = api.MAX_RESTARTS * 1000
LAST_WORKER = api.MAX_WORKERS - 1


def _job_names(length: int) -> list[str]:
    """Valid TrainingJob names (DNS subdomains) of a given length, in several shapes."""
    plain = ("a" + "b" * (length - 1))[:length]
    out = [plain]
    if length >= 3:
        out.append(("x.y" + "z" * length)[:length])  # dots
        out.append(("7" + "q" * length)[:length])  # leading digit
        out.append(("a-" * length)[: length - 1] + "z")  # dashes
    return out


@pytest.mark.parametrize("length", [1, 2, 10, 40, 47, 48, 49, 50, 51, 62, 63, 64, 100, 200, 253])
def test_child_names_are_valid_for_every_name_length(length: int) -> None:
    for job in _job_names(length):
        service = names.service_name(job)
        assert names.is_dns1035_label(service), (job, service)
        for attempt in (0, 1, 9, LONGEST_ATTEMPT):
            for index in (0, 1, LAST_WORKER):
                worker = names.worker_job_name(job, attempt, index)
                assert names.is_dns1123_label(worker), (job, worker)
                assert len(worker) <= 63
        assert names.is_label_value(names.job_label_value(job)), job


@pytest.mark.parametrize(
    "job",
    ["demo", "resnet-cifar10", "a" * names.MAX_BASE],
)
def test_short_dns_names_are_kept_as_they_are(job: str) -> None:
    assert names.service_name(job) == job
    assert names.worker_job_name(job, 2, 3) == f"{job}-r2-w3"
    assert names.job_label_value(job) == job


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("a.b", "a-b"),  # dots are replaced, so the hash must tell them apart
        ("x" * 60 + "1", "x" * 60 + "2"),  # long names sharing a prefix
        ("x" * 200 + "a", "x" * 200 + "b"),
        ("1abc", "tj-1abc"),  # a leading digit gets a prefix
        ("a" * 70, "a" * 71),
    ],
)
def test_different_trainingjobs_never_share_child_names(first: str, second: str) -> None:
    assert names.service_name(first) != names.service_name(second)
    assert names.worker_job_name(first, 0, 0) != names.worker_job_name(second, 0, 0)
    assert names.job_label_value(first) != names.job_label_value(second) or len(first) <= 63


def test_worker_names_are_unique_across_attempts_and_indexes() -> None:
    job = "z" * 253
    seen = {names.worker_job_name(job, a, i) for a in range(0, 30) for i in range(0, 40)}
    assert len(seen) == 30 * 40


def test_worker_dns_is_hostname_dot_service_dot_namespace() -> None:
    assert names.worker_dns("demo", "team-a", 1, 0) == "demo-r1-w0.demo.team-a.svc"


def test_names_are_deterministic() -> None:
    long = "n" * 120
    assert names.base(long) == names.base(long)
    assert names.base(long).endswith(names.short_hash(long))
