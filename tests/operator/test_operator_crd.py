"""The generated CRD: no drift from the models, structural, documented, and refusing bad manifests."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
from kubetrain_operator import api
from kubetrain_operator.api import crdgen, fieldpaths
from testcluster.manifests import RefusedCase, accepted_trainingjobs, refused_cases

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
REFUSED = refused_cases()


def _schema() -> dict[str, Any]:
    return crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for key, child in (node.get("properties") or {}).items():
        out += _walk(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        out += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += _walk(node["additionalProperties"], f"{path}[*]")
    return out


def test_checked_in_crds_match_the_models() -> None:
    assert crdgen.drifted(ROOT) == [], "run `kubetrain crds` and commit the result"


def test_schema_is_structural() -> None:
    text = crdgen.render()
    assert "$ref" not in text and "$defs" not in text
    for path, node in _walk(_schema()):
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            continue
        assert "anyOf" not in node and "oneOf" not in node and "allOf" not in node, path
        assert node.get("type") in ("object", "array", "string", "integer", "number", "boolean"), path
        assert node.get("additionalProperties") is not False, path
        assert node.get("nullable") is not True, path
        for flag in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(flag, False), bool), path  # OpenAPI v3.0, not JSON Schema 2020
        if node["type"] == "object" and "properties" in node:
            assert "additionalProperties" not in node, path


def test_every_field_has_a_description_that_starts_with_its_name() -> None:
    for path, node in _walk(_schema()):
        if path.count(".") < 2 or path.endswith(("[]", "[*]")) or path.startswith(".metadata"):
            continue
        name = path.rsplit(".", 1)[-1]
        assert node.get("description"), f"{path} has no description"
        if path.startswith(".spec.trainer"):
            continue  # the trainer's own models use snake_case names in their text
        assert node["description"].startswith(name), f"{path}: {node['description'][:40]}"


def test_defaults_live_in_the_schema() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["workers"]["default"] == 1
    assert spec["nprocPerWorker"]["default"] == "auto"
    assert spec["runPolicy"]["default"] == {}
    assert spec["runPolicy"]["properties"]["maxRestarts"]["default"] == 3
    assert spec["runPolicy"]["properties"]["cleanPodPolicy"]["default"] == "Running"
    assert spec["failurePolicy"]["properties"]["nonRetryableExitCodes"]["default"] == [2, 3]
    assert spec["trainer"]["properties"]["epochs"]["default"] == 10


def test_status_declares_everything_the_operator_writes() -> None:
    status = _schema()["properties"]["status"]["properties"]
    for field in (
        "phase",
        "message",
        "conditions",
        "workers",
        "workersReady",
        "restarts",
        "restartAttempt",
        "startTime",
        "completionTime",
        "observedGeneration",
        "pendingReason",
        "pendingMessage",
        "lastFailure",
        "progress",
    ):
        assert field in status, field
    assert status["phase"]["enum"] == list(api.PHASES)
    assert "default" not in crdgen.yaml.safe_dump(status)


def test_subresource_and_printer_columns() -> None:
    version = crdgen.crd()["spec"]["versions"][0]
    assert version["subresources"] == {
        "status": {},
        "scale": {"specReplicasPath": ".spec.workers", "statusReplicasPath": ".status.workers.active"},
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Ready"] == ".status.workersReady"
    assert columns["World-Size"] == ".status.elastic.worldSize"
    assert columns["Restarts"] == ".status.restarts"
    assert columns["Epoch"] == ".status.progress.epoch"
    assert columns["Train-Loss"] == ".status.progress.loss"
    assert columns["Val-Loss"] == ".status.progress.validationLoss"
    assert columns["Val-Accuracy"] == ".status.progress.accuracy"
    assert columns["Age"] == ".metadata.creationTimestamp"
    names = crdgen.crd()["spec"]["names"]
    assert names["shortNames"] == ["tj"] and names["plural"] == "trainingjobs"


def test_shape_fields_are_immutable_and_policies_are_not() -> None:
    """Each immutable field keeps its value (a rule on the field, or on each of its children) and, when it
    may be absent, its presence (a rule on spec); spec.workers changes only on an elastic job."""
    spec = _schema()["properties"]["spec"]
    on_spec = {
        r["fieldPath"].lstrip("."): r["rule"]
        for r in spec["x-kubernetes-validations"]
        if "oldSelf" in r["rule"]
    }

    def value_kept(field: dict[str, Any]) -> bool:
        return any(r["rule"] == "self == oldSelf" for r in field.get("x-kubernetes-validations", ()))

    on_field = {name for name, field in spec["properties"].items() if value_kept(field)}
    by_child = {
        name
        for name, field in spec["properties"].items()
        if field.get("properties") and all(value_kept(child) for child in field["properties"].values())
    }
    assert by_child == set(api.IMMUTABLE_BY_CHILD)
    for name in by_child:  # a child that may be absent keeps its absence (or presence) too
        trainer = spec["properties"][name]
        presence = {r["rule"] for r in trainer.get("x-kubernetes-validations", ()) if "oldSelf" in r["rule"]}
        optional = {c for c, child in trainer["properties"].items() if "default" not in child}
        assert presence == {f"has(self.{c}) == has(oldSelf.{c})" for c in optional}, name
    assert on_spec["workers"] == "has(self.elastic) || self.workers == oldSelf.workers"
    on_field |= by_child
    assert on_field | {"workers"} == set(api.IMMUTABLE_SPEC_FIELDS)
    for name in on_field:
        presence = (
            None if "default" in spec["properties"][name] else f"has(self.{name}) == has(oldSelf.{name})"
        )
        assert on_spec.get(name) == presence, name
    for mutable in ("runPolicy", "failurePolicy", "nodeSelector", "tolerations", "env", "podLabels"):
        assert mutable not in on_field and mutable not in on_spec


def test_lists_and_strings_compared_by_cel_are_bounded() -> None:
    """CEL cost estimation rejects rules over unbounded lists: everything immutable must be bounded."""
    spec = _schema()["properties"]["spec"]["properties"]
    for field in api.IMMUTABLE_SPEC_FIELDS:
        for path, node in _walk(spec[field], field):
            if node.get("type") == "array":
                assert "maxItems" in node, path
            if node.get("x-kubernetes-preserve-unknown-fields"):
                pytest.fail(f"{path}: free-form object inside an immutable field")


# ------------------------------------------------------------ invalid manifests


class _RefusedError(Exception):
    pass


def _check(node: dict[str, Any], value: Any, path: str) -> None:
    """A small OpenAPI validator for the subset of keywords the generated schema uses (not CEL)."""
    if node.get("x-kubernetes-int-or-string"):
        if not isinstance(value, int | str) or isinstance(value, bool):
            raise _RefusedError(path)
        if isinstance(value, str) and "pattern" in node and not re.search(node["pattern"], value):
            raise _RefusedError(path)
        if isinstance(value, int) and value < node.get("minimum", value):
            raise _RefusedError(path)
        return
    kind = node.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "number": int | float}
    if kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            raise _RefusedError(path)
    elif kind in types and not isinstance(value, types[kind]):
        raise _RefusedError(path)
    if "enum" in node and value not in node["enum"]:
        raise _RefusedError(path)
    if "minimum" in node and (
        value < node["minimum"] or (node.get("exclusiveMinimum") and value == node["minimum"])
    ):
        raise _RefusedError(path)
    if "maximum" in node and (
        value > node["maximum"] or (node.get("exclusiveMaximum") and value == node["maximum"])
    ):
        raise _RefusedError(path)
    if kind == "string":
        if len(value) < node.get("minLength", 0) or len(value) > node.get("maxLength", 10**9):
            raise _RefusedError(path)
        if "pattern" in node and not re.search(node["pattern"], value):
            raise _RefusedError(path)
    if kind == "array":
        if len(value) > node.get("maxItems", 10**9) or len(value) < node.get("minItems", 0):
            raise _RefusedError(path)
        keys = node.get("x-kubernetes-list-map-keys")
        seen = set()
        for i, item in enumerate(value):
            _check(node["items"], item, f"{path}[{i}]")
            if keys:
                key = tuple(item.get(k) for k in keys)
                if key in seen:
                    raise _RefusedError(f"{path}[{i}]")  # the API server's "Duplicate value"
                seen.add(key)
    if kind == "object":
        if len(value) > node.get("maxProperties", 10**9):
            raise _RefusedError(path)
        for key in node.get("required", ()):
            if key not in value:
                raise _RefusedError(f"{path}.{key}")
        props = node.get("properties")
        for key, item in value.items():
            if props is not None:
                if key not in props:
                    raise _RefusedError(f"{path}.{key}")  # kubectl's strict field validation
                _check(props[key], item, f"{path}.{key}")
            elif isinstance(node.get("additionalProperties"), dict):
                _check(node["additionalProperties"], item, f"{path}.{key}")


def test_the_refusal_table_covers_at_least_a_hundred_cases_with_unique_names() -> None:
    names = [case.name for case in REFUSED]
    assert len(names) >= 100
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("case", REFUSED, ids=[case.name for case in REFUSED])
def test_the_operator_refuses_every_case_naming_the_field(case: RefusedCase) -> None:
    """The operator's own models refuse what the API server refuses (for CRDs installed without the
    rules), and its InvalidSpec message names the same field."""
    with pytest.raises(pydantic.ValidationError) as refused:
        api.TrainingJobSpec.model_validate(case.manifest["spec"])
    message = fieldpaths.spec_error(refused.value)
    parent, _, leaf = case.field.rpartition(".")
    assert case.field in message or (leaf in message and parent.split("[")[0] in message), message


@pytest.mark.parametrize("case", REFUSED, ids=[case.name for case in REFUSED])
def test_schema_cases_are_refused_by_openapi_keywords_and_cel_cases_only_by_rules(case: RefusedCase) -> None:
    spec = _schema()["properties"]["spec"]
    if case.by == "schema":
        with pytest.raises(_RefusedError) as refused:
            _check(spec, case.manifest["spec"], "spec")
        assert str(refused.value).startswith(case.field.split("[")[0]), (str(refused.value), case.field)
    else:
        _check(spec, case.manifest["spec"], "spec")  # nothing but CEL refuses it


@pytest.mark.parametrize(
    "spec",
    [
        *(m["spec"] for m in accepted_trainingjobs()),
        {"trainer": {}},
        {"trainer": {"epochs": 1, "data": {"dataset": "fake"}}, "workers": 3},
    ],
)
def test_valid_manifests_pass_both_validators(spec: dict[str, Any]) -> None:
    api.TrainingJobSpec.model_validate(spec)
    _check(_schema()["properties"]["spec"], spec, "spec")
