"""The chart's monitoring: the alert rules pass the real promtool (`check rules`, and `test rules` with the
unit tests in testdata/), the Grafana dashboard ships in a ConfigMap the sidecar finds, and both are off
unless asked for. That their metric names are the operator's is checked against its running /metrics in
tests/operator_cluster/test_operator_metrics_served.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import of_kind, only, render
from testcluster import binaries, monitoring

pytestmark = pytest.mark.unit

ALERT_TESTS = Path(__file__).parent / "testdata" / "trainingjob-alerts.test.yaml"
ALERTS = {"TrainingJobFailed", "TrainingJobRestartingRepeatedly", "TrainingJobStalled"}


@pytest.fixture(scope="session")
def promtool() -> Path:
    return binaries.ensure_promtool()


def write_rules(directory: Path, groups: list[dict[str, Any]]) -> Path:
    """The rule groups as a Prometheus rule file (what the Prometheus Operator writes from the object)."""
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def run(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    "values",
    [{}, {"stalledMinutes": 90, "restarts": 5, "restartWindow": "6h"}],
    ids=["defaults", "tuned"],
)
@pytest.mark.binaries
def test_promtool_checks_the_rendered_rules(
    helm_bin: Path, promtool: Path, tmp_path: Path, values: dict[str, Any]
) -> None:
    groups = monitoring.rendered_rule_groups(helm_bin, values)
    assert {rule["alert"] for group in groups for rule in group["rules"]} == ALERTS
    rules = write_rules(tmp_path, groups)
    checked = run(promtool, "check", "rules", str(rules), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 3 rules found" in checked.stdout, checked.stdout
    if values:  # the values reach the expressions
        queries = "\n".join(monitoring.rule_queries(groups))
        assert "[6h])) >= 5" in queries and "> 5400" in queries and "<= 5400" in queries


@pytest.mark.binaries
def test_the_alerts_fire_as_their_promtool_unit_tests_say(
    helm_bin: Path, promtool: Path, tmp_path: Path
) -> None:
    write_rules(tmp_path, monitoring.rendered_rule_groups(helm_bin))
    tests = shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = run(promtool, "test", "rules", str(tests), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


@pytest.mark.binaries
def test_promtool_fails_an_alert_that_does_not_fire_as_tested(
    helm_bin: Path, promtool: Path, tmp_path: Path
) -> None:
    """The unit tests can fail: with a stall window of 60 minutes the 30-minute expectations are wrong."""
    write_rules(tmp_path, monitoring.rendered_rule_groups(helm_bin, {"stalledMinutes": 60}))
    tests = shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = run(promtool, "test", "rules", str(tests), cwd=tmp_path)
    assert result.returncode != 0
    assert "TrainingJobStalled" in result.stdout + result.stderr


@pytest.mark.binaries
def test_monitoring_objects_are_off_by_default_and_need_metrics(helm_bin: Path, tmp_path: Path) -> None:
    assert not of_kind(render(helm_bin, tmp_path), "PrometheusRule")
    assert not of_kind(render(helm_bin, tmp_path), "ConfigMap")
    both = {"prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}}
    objects = render(helm_bin, tmp_path, {"metrics": {"enabled": False, **both}})
    assert not of_kind(objects, "PrometheusRule") and not of_kind(objects, "ConfigMap")
    objects = render(helm_bin, tmp_path, {"metrics": both})
    assert only(objects, "PrometheusRule")["metadata"]["namespace"] == "kubetrain-system"
    assert only(objects, "ConfigMap")["metadata"]["namespace"] == "kubetrain-system"


@pytest.mark.binaries
def test_the_prometheus_rule_carries_the_labels_prometheus_selects(helm_bin: Path, tmp_path: Path) -> None:
    values = {"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}}}
    rule = only(render(helm_bin, tmp_path, values), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prom"


@pytest.mark.binaries
def test_the_dashboard_ships_in_a_configmap_grafanas_sidecar_loads(helm_bin: Path, tmp_path: Path) -> None:
    values = {
        "metrics": {
            "dashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "annotations": {"grafana_folder": "Training"},
            }
        }
    }
    config_map = only(render(helm_bin, tmp_path, values), "ConfigMap")
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Training"}
    (shipped,) = config_map["data"].values()
    assert json.loads(shipped) == monitoring.dashboard()


def test_the_dashboard_plots_loss_accuracy_throughput_phases_restarts_and_reconcile_latency() -> None:
    board = monitoring.dashboard()
    plotted: dict[str, set[str]] = {}
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            plotted.setdefault(panel["title"], set()).update(monitoring.metric_names(target["expr"]))
    wanted = {
        "kubetrain_trainingjob_training_loss",
        "kubetrain_trainingjob_validation_loss",
        "kubetrain_trainingjob_validation_accuracy",
        "kubetrain_trainingjob_images_per_second",
        "kubetrain_trainingjob_phase",
        "kubetrain_trainingjob_restarts_total",
        "kubetrain_reconcile_duration_seconds_bucket",
    }
    assert wanted <= set().union(*plotted.values()), plotted
    per_job = [
        target["legendFormat"]
        for panel in board["panels"]
        for target in panel.get("targets", [])
        if "kubetrain_trainingjob_phase" not in target["expr"] and "trainingjob=~" in target["expr"]
    ]
    assert per_job and all("{{trainingjob}}" in legend for legend in per_job)
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    uses = {panel["datasource"]["uid"] for panel in board["panels"] if "datasource" in panel}
    assert uses == {"${datasource}"}


def test_metric_names_are_read_from_promql_as_prometheus_would() -> None:
    expr = (
        'sum by (le, job) (rate(a_seconds_bucket{x="y{}", z=~"$v"}[5m] offset 1h)) '
        "* on (a) group_left (b) b_total > bool 1e3 unless c"
    )
    assert monitoring.metric_names(expr) == {"a_seconds_bucket", "b_total", "c"}
    assert monitoring.metric_names('label_values(d{n=~"$n"}, trainingjob)') == {"d"}
    assert monitoring.metric_names("time() - e > 60 * 30") == {"e"}
