"""The operator's /metrics, scraped from the running process, against what the README documents."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from testcluster.cluster import Cluster
from testcluster.manifests import trainingjob
from testcluster.operator_process import OperatorProcess
from testcluster.waiting import wait_for

pytestmark = pytest.mark.cluster

README = Path(__file__).resolve().parents[2] / "README.md"


def documented_metrics() -> set[str]:
    """The metric names in the README's Metrics bullet, as a user would type them into a query."""
    text = README.read_text()
    bullet = text[text.index("- **Metrics**") :]
    bullet = bullet[: bullet.index("\n- **", 1)]
    return set(re.findall(r"`(kubetrain_[a-z_]+)`", bullet))


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of the exposition: name -> labels -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_every_metric_the_readme_names_is_scraped_from_the_running_operator(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """One job succeeds, one fails after a restart, so every counter has a sample in this namespace."""
    assert operator.metrics_url is not None
    fine = trainingjob("fine", workers=1)
    doomed = trainingjob("doomed", workers=1, annotations={"sim.kubetrain.io/exit-code": "11"})
    doomed["spec"]["runPolicy"] = {"maxRestarts": 1}
    for manifest in (fine, doomed):
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=json.dumps(manifest))
    documented = documented_metrics()
    assert len(documented) >= 8, documented

    def in_namespace(name: str) -> bool:
        return any(
            ("namespace", namespace) in labels for labels in scrape(operator.metrics_url).get(name, {})
        )

    wait_for(
        lambda: (
            in_namespace("kubetrain_trainingjobs_succeeded_total")
            and in_namespace("kubetrain_trainingjobs_failed_total")
        ),
        "one TrainingJob counted as succeeded and one as failed",
        timeout=120,
        explain=lambda: f"operator log:\n{operator.log_tail()}",
    )
    samples = scrape(operator.metrics_url)
    scraped = set(samples) | {name.removesuffix("_count") for name in samples if name.endswith("_count")}
    assert documented - scraped == set(), f"documented but not served: {sorted(documented - scraped)}"
    for counter in ("created", "succeeded", "failed", "restarted"):
        by_namespace = samples[f"kubetrain_trainingjobs_{counter}_total"]
        assert by_namespace.get((("namespace", namespace),), 0) >= 1, (counter, by_namespace)
    ours = {name for name in samples if name.startswith("kubetrain_") and not name.endswith("_created")}
    families = {re.sub(r"_(bucket|sum|count)$", "", name) for name in ours}
    assert families - documented == set(), f"served but not documented: {sorted(families - documented)}"
