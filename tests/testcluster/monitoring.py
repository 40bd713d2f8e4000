"""What the chart's monitoring objects query: the Grafana dashboard's and the alert rules' PromQL, and the
metric names in it, for the tests that check them against promtool and against the operator's /metrics."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from testcluster import binaries

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "kubetrain"
DASHBOARD = CHART_DIR / "dashboards" / "kubetrain-trainingjobs.json"
RULE_TEMPLATE = "templates/prometheusrule.yaml"

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "start", "end"}
"""Words of PromQL that stand where a metric name could, and are none."""
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_WORD = re.compile(r"(?<![\w.:$])[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"label_values\((?P<selector>.*),\s*\w+\s*\)", re.DOTALL)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: every bare word that is not a function or aggregation
    (followed by a parenthesis), a keyword, or inside a string, a label matcher, a range or a label list.
    A Grafana variable query `label_values(<selector>, <label>)` reads its selector's."""
    found = _LABEL_VALUES.fullmatch(expr.strip())
    if found:
        expr = found.group("selector")
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for word in _WORD.finditer(text):
        if text[word.end() :].lstrip().startswith("(") or word.group() in _KEYWORDS:
            continue
        names.add(word.group())
    return names


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries(board: dict[str, Any]) -> list[str]:
    """Every query of the dashboard: its panels' targets (rows' nested panels too) and its variables'."""
    panels = [*board.get("panels", [])]
    panels += [inner for panel in board.get("panels", []) for inner in panel.get("panels", [])]
    queries = [target["expr"] for panel in panels for target in panel.get("targets", [])]
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def rendered_rule_groups(helm_bin: Path, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rule groups of the chart's PrometheusRule as `helm template` renders it (enabled, plus
    `values` under metrics.prometheusRule): what the Prometheus Operator hands Prometheus."""
    rule_values = {"metrics": {"prometheusRule": {"enabled": True, **(values or {})}}}
    result = subprocess.run(
        [
            *(str(helm_bin), "template", "kt", str(CHART_DIR), "--show-only", RULE_TEMPLATE, "-f", "-"),
            *("--kube-version", binaries.KUBERNETES_VERSION),
        ],
        input=yaml.safe_dump(rule_values),
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    (rule,) = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return rule["spec"]["groups"]


def rule_queries(groups: list[dict[str, Any]]) -> list[str]:
    return [rule["expr"] for group in groups for rule in group["rules"]]
