"""The chart README's claims against the chart: its values table against values.yaml, its RBAC tables and
statements against what `helm template` renders."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import CHART_DIR, granted, of_kind, operator_objects, render

CHART_README = CHART_DIR / "README.md"
RELEASE = "kt"
FULLNAME = f"{RELEASE}-kubetrain"
NAMESPACED = {"watchNamespaces": ["team-a"]}


def section(heading: str) -> str:
    """The chart README's section under `## heading`, up to the next `## `."""
    text = CHART_README.read_text()
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every Markdown table in `text`, as lists of stripped cells."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|") or re.fullmatch(r"[|\-\s]+", line):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows.append(cells)
    return [row for row in rows if row[0] not in {"key", "API group"}]


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def brace_expand(key: str) -> list[str]:
    """`a.{b,c}` -> a.b, a.c."""
    match = re.fullmatch(r"([^{]*)\{([^}]*)\}(.*)", key)
    if not match:
        return [key]
    head, options, tail = match.groups()
    return [f"{head}{option.strip()}{tail}" for option in options.split(",")]


def values_table() -> list[tuple[list[str], str]]:
    """Each row of the Values table: the keys it names (braces expanded) and its default cell."""
    rows = []
    for cells in table_rows(section("Values")):
        keys = [expanded for span in code_spans(cells[0]) for expanded in brace_expand(span)]
        rows.append((keys, cells[1]))
    return rows


def value_paths(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every key path of values.yaml (maps and leaves alike) -> its value."""
    paths: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        paths[path] = value
        if isinstance(value, dict):
            paths.update(value_paths(value, f"{path}."))
    return paths


def leaves(paths: dict[str, Any]) -> set[str]:
    return {path for path, value in paths.items() if not (isinstance(value, dict) and value)}


VALUES = value_paths(yaml.safe_load((CHART_DIR / "values.yaml").read_text()))


@pytest.mark.unit
def test_the_values_table_names_every_key_of_values_yaml() -> None:
    """Every leaf of values.yaml is in the table, itself or through a key above it that the table names
    whole (`resources`, `podSecurityContext`: Kubernetes objects passed through)."""
    documented = {key for keys, _ in values_table() for key in keys}
    undocumented = sorted(
        leaf
        for leaf in leaves(VALUES)
        if not any(leaf == key or leaf.startswith(f"{key}.") for key in documented)
    )
    assert not undocumented, f"values.yaml keys missing from the chart README's Values table: {undocumented}"
    assert "kueue.enabled" in documented


@pytest.mark.unit
def test_every_key_the_values_table_names_is_in_values_yaml() -> None:
    stale = sorted({key for keys, _ in values_table() for key in keys} - set(VALUES))
    assert not stale, f"the chart README's Values table names keys values.yaml does not have: {stale}"


@pytest.mark.unit
def test_the_values_tables_defaults_are_values_yamls() -> None:
    """Where a row gives one default per key it names (`8081`, `10`, ... for five keys), each is the key's
    value in values.yaml, read as YAML."""
    compared = 0
    for keys, default in values_table():
        given = code_spans(default)
        if len(given) != len(keys):
            continue
        for key, written in zip(keys, given, strict=True):
            assert yaml.safe_load(written) == VALUES[key], (
                f"{key}: the README says {written}, values.yaml {VALUES[key]!r}"
            )
            compared += 1
    assert compared >= 15, f"only {compared} defaults compared: has the table's layout changed?"


# --- RBAC ---------------------------------------------------------------------------------------------------


def rbac_tables() -> tuple[set[tuple[str, str, str]], set[tuple[str, str, str]]]:
    """The RBAC section's two tables as (group, resource, verb) triples: the operator's rules in each
    watched namespace, and what watching all namespaces adds for the workers' identity. Rows marked
    "with `kueue.enabled`" are returned in the first set too."""
    text = section("RBAC: what the operator uses, and nothing else")
    first, second = text.split("Watching all namespaces with `workerServiceAccount.create`", 1)

    def triples(part: str) -> set[tuple[str, str, str]]:
        return {triple for cells in table_rows(part) for triple in row_triples(cells)}

    return triples(first), triples(second)


def row_triples(cells: list[str]) -> set[tuple[str, str, str]]:
    """An RBAC table row (`API group | resource | verbs | why`) as triples; `""` is the core group, and a
    cell may name several groups or verbs, comma-separated."""
    groups = ["" if group.strip() == '""' else group.strip().strip("`") for group in cells[0].split(",")]
    resource = cells[1].replace("`", "").split()[0]
    verbs = [verb.strip() for verb in cells[2].split(",")]
    return {(group, resource, verb) for group in groups for verb in verbs}


def kueue_rows() -> set[tuple[str, str, str]]:
    text = section("RBAC: what the operator uses, and nothing else")
    rows = [cells for cells in table_rows(text) if cells[3].startswith("with `kueue.enabled`")]
    assert rows, "the RBAC table marks no row as Kueue's"
    return {triple for cells in rows for triple in row_triples(cells)}


def cluster_scoped_rbac(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] in ("ClusterRole", "ClusterRoleBinding")]


@pytest.mark.binaries
@pytest.mark.parametrize("kueue", [True, False], ids=["kueue", "no-kueue"])
def test_the_rbac_table_is_what_each_watched_namespace_grants(
    helm_bin: Path, tmp_path: Path, kueue: bool
) -> None:
    """With `watchNamespaces`, the operator's Role there grants exactly the first table's rows (the rows
    marked "with `kueue.enabled`" only when it is)."""
    operator_rules, _ = rbac_tables()
    if not kueue:
        operator_rules -= kueue_rows()
    objects = render(helm_bin, tmp_path, {**NAMESPACED, "kueue": {"enabled": kueue}}, release=RELEASE)
    (role,) = operator_objects(objects, "Role")
    assert role["metadata"]["namespace"] == "team-a"
    assert granted(role["rules"]) == operator_rules


@pytest.mark.binaries
def test_watching_given_namespaces_grants_nothing_cluster_wide_but_kueues_read_only_role(
    helm_bin: Path, tmp_path: Path
) -> None:
    """The README's statement (RBAC and Trust model): with `watchNamespaces`, the one cluster-wide grant
    is the read-only `<fullname>-kueue` ClusterRole, only while `kueue.enabled`; and the resources and
    verbs of that role are the ones the RBAC section names."""
    rbac = section("RBAC: what the operator uses, and nothing else")
    trust = re.sub(r"\s+", " ", section("Trust model"))
    assert (
        "nothing cluster-wide is granted but the read-only `<fullname>-kueue` ClusterRole when `kueue.enabled`"
        in trust
    )
    assert "`<fullname>-kueue`, the only cluster-wide grant in that mode" in re.sub(r"\s+", " ", rbac)

    with_kueue = cluster_scoped_rbac(render(helm_bin, tmp_path, NAMESPACED, release=RELEASE))
    assert sorted((obj["kind"], obj["metadata"]["name"]) for obj in with_kueue) == [
        ("ClusterRole", f"{FULLNAME}-kueue"),
        ("ClusterRoleBinding", f"{FULLNAME}-kueue"),
    ]
    (role,) = of_kind(with_kueue, "ClusterRole")
    for _, resource, verb in granted(role["rules"]):
        assert verb in ("get", "list", "watch"), f"the Kueue ClusterRole is not read-only: {verb} {resource}"
        assert f"`{resource}`" in rbac and f"`{verb}`" in rbac, (
            f"the RBAC section does not name {verb} {resource}"
        )

    without = render(helm_bin, tmp_path, {**NAMESPACED, "kueue": {"enabled": False}}, release=RELEASE)
    assert cluster_scoped_rbac(without) == []


@pytest.mark.binaries
def test_watching_all_namespaces_grants_the_tables_and_what_the_rbac_section_adds(
    helm_bin: Path, tmp_path: Path
) -> None:
    """The default install's ClusterRole: both tables, plus only rules whose resource and verbs the RBAC
    section names in its text (Kueue's cluster-scoped reads)."""
    operator_rules, identity_rules = rbac_tables()
    rbac = section("RBAC: what the operator uses, and nothing else")
    (role,) = operator_objects(render(helm_bin, tmp_path, release=RELEASE), "ClusterRole")
    rules = granted(role["rules"])
    assert operator_rules | identity_rules <= rules
    for _, resource, verb in rules - operator_rules - identity_rules:
        assert f"`{resource}`" in rbac and verb in rbac, (
            f"granted but not in the RBAC section: {verb} {resource}"
        )


@pytest.mark.binaries
def test_leader_election_grants_get_and_update_on_its_lease_by_name(helm_bin: Path, tmp_path: Path) -> None:
    rbac = re.sub(r"\s+", " ", section("RBAC: what the operator uses, and nothing else"))
    assert "a Role in the release namespace allows only `get`/`update` on that Lease, by name" in rbac
    objects = render(
        helm_bin, tmp_path, {"replicas": 2, "leaderElection": {"enabled": True}}, release=RELEASE
    )
    lease_rules = [
        rule for role in of_kind(objects, "Role") for rule in role["rules"] if "leases" in rule["resources"]
    ]
    assert lease_rules == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [FULLNAME],
            "verbs": ["get", "update"],
        }
    ]
