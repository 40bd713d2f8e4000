"""The `kubetrain` entry point: CRD generation, trainer delegation, operator options."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from kubetrain_operator import cli
from kubetrain_operator.api import crdgen
from kubetrain_operator.planning import admission
from kubetrain_operator.runtime import main

pytestmark = pytest.mark.unit


def test_crds_check_passes_on_the_repository() -> None:
    assert cli.main(["crds", "--check", "--root", str(Path(__file__).resolve().parents[2])]) == 0


def test_crds_check_fails_on_drift_and_generation_fixes_it(tmp_path: Path) -> None:
    assert cli.main(["crds", "--check", "--root", str(tmp_path)]) == 1
    assert cli.main(["crds", "--root", str(tmp_path)]) == 0
    assert cli.main(["crds", "--check", "--root", str(tmp_path)]) == 0
    (tmp_path / crdgen.CRD_PATHS[1]).write_text("edited by hand\n")
    assert cli.main(["crds", "--check", "--root", str(tmp_path)]) == 1


@pytest.mark.parametrize("command", ["train", "evaluate", "predict"])
def test_trainer_commands_are_delegated_with_their_argv(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("kubetrain_trainer.cli")
    fake.main = lambda argv: seen.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kubetrain_trainer.cli", fake)
    import kubetrain_trainer

    monkeypatch.setattr(kubetrain_trainer, "cli", fake, raising=False)
    assert cli.main([command, "--config", "x.yaml"]) == 0
    assert seen == [[command, "--config", "x.yaml"]]


def test_operator_flags_reach_kopf(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: dict[str, Any] = {}
    monkeypatch.setattr(main, "run", lambda options: captured.setdefault("options", options))
    cli.main(
        [
            "operator",
            "-n",
            "a",
            "-n",
            "b",
            "--default-image",
            "img:1",
            "--metrics-port",
            "0",
            "--liveness",
            "",
        ]
    )
    options = captured["options"]
    assert options.watched_namespaces() == ["a", "b"]
    assert options.default_image == "img:1"
    assert options.metrics_port == 0
    assert options.liveness is None


def test_all_namespaces_and_env_fallbacks() -> None:
    options = main.Options.from_env(
        {"KUBETRAIN_NAMESPACES": "x, y", "KUBETRAIN_DEFAULT_IMAGE": "i:2", "KUBETRAIN_ALL_NAMESPACES": "true"}
    )
    assert options.namespaces == ["x", "y"]
    assert options.default_image == "i:2"
    assert options.watched_namespaces() == []  # clusterwide


def test_with_no_flags_the_operator_runs_with_every_option_its_environment_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fields of `Options` and the flags of `kubetrain operator` are the two places an option is
    written: this holds them together (a flag whose dest is not a field, or a field the flags lose)."""
    env = {
        "KUBETRAIN_NAMESPACES": "a,b",
        "KUBETRAIN_ALL_NAMESPACES": "true",
        "KUBETRAIN_DEFAULT_IMAGE": "img:2",
        "KUBETRAIN_WORKER_SERVICE_ACCOUNT": "sa",
        "KUBETRAIN_WORKER_CLUSTER_ROLE": "role",
        "KUBETRAIN_METRICS_PORT": "9000",
        "KUBETRAIN_LIVENESS": "http://0.0.0.0:9001/healthz",
        "KUBETRAIN_WORKERS": "3",
        "KUBETRAIN_LOG_FORMAT": "json",
        "KUBETRAIN_LEADER_ELECT": "true",
        "KUBETRAIN_LEADER_ELECTION_NAMESPACE": "ops",
        "KUBETRAIN_LEADER_ELECTION_ID": "lease",
        "KUBETRAIN_ALLOWED_VOLUME_TYPES": "emptyDir",
        "KUBETRAIN_ALLOWED_SERVICE_ACCOUNTS": "",
        "KUBETRAIN_KUEUE": "false",
    }
    variables = {
        field.metadata["env"] for field in dataclasses.fields(main.Options) if "env" in field.metadata
    }
    assert variables == set(env), "every variable an option reads is set here"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    captured: dict[str, Any] = {}
    monkeypatch.setattr(main, "run", lambda options: captured.setdefault("options", options))
    cli.main(["operator"])
    options = captured["options"]
    assert options == main.Options.from_env()
    assert options != main.Options()  # every value above differs from the default
    for field in dataclasses.fields(main.Options):
        if "env" in field.metadata:
            assert getattr(options, field.name) != getattr(main.Options(), field.name), field.name


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("KUBETRAIN_LEADER_ELECT", "maybe", "expected true or false"),
        ("KUBETRAIN_WORKERS", "many", "expected a whole number"),
    ],
)
def test_an_environment_value_that_does_not_parse_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as refused:
        cli.main(["operator"])
    assert f"{variable}={value!r}: {expected}" in str(refused.value.code)


def test_the_operator_never_imports_torch() -> None:
    """In a fresh interpreter: this test process may already hold torch from the trainer tests."""
    probe = (
        "import sys, kubetrain_operator.cli, kubetrain_operator.runtime.main, kubetrain_operator.local.command; "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_kopf_handles_no_objects_so_it_writes_nothing_on_trainingjobs_and_puts_no_finalizer() -> None:
    """Deleting a TrainingJob must never hang while the operator is down (GC does the cleanup), and kopf
    keeps no bookkeeping on it: kopf runs only the operator's start and stop (importing the runtime
    registers them), and TrainingJobs and their children come from the operator's informers."""
    import kopf
    from kubetrain_operator.runtime import main

    registry = kopf.get_default_registry()
    for resource_handlers in (
        registry._changing,
        registry._spawning,
        registry._watching,
        registry._indexing,
        registry._webhooks,
    ):
        assert not resource_handlers.get_all_handlers()
    activities = {handler.fn for handler in registry._activities.get_all_handlers()}
    assert {main.configure, main.shutdown} <= activities


@pytest.mark.parametrize(
    ("kueue_served", "watched"),
    [
        (False, ["Job", "Pod", "Service", "TrainingJob"]),
        (True, ["Job", "Pod", "ResourceFlavor", "Service", "TrainingJob", "Workload"]),
    ],
)
def test_startup_settings(monkeypatch: pytest.MonkeyPatch, kueue_served: bool, watched: list[str]) -> None:
    """Kueue's Workloads and ResourceFlavors are watched only where the cluster serves Kueue's API."""
    import kopf
    from kubetrain_operator.runtime import kube

    class NoApi:
        def __init__(self, **_: object) -> None:
            pass

        def serves(self, api_version: str) -> bool:
            assert api_version == "kueue.x-k8s.io/v1beta2"
            return kueue_served

        def create(self, manifest: dict[str, object]) -> None:
            raise AssertionError("no request expected")

        def list_pages(self, *args: object) -> list[tuple[list[dict[str, object]], str]]:
            return []

        def served_resources(self, api_version: str) -> frozenset[str]:
            """Discovery: Volcano's PodGroup and the Workload API are both served."""
            if api_version == "scheduling.volcano.sh/v1beta1":
                return frozenset({"podgroups", "queues"})
            if api_version == "scheduling.k8s.io/v1beta1":
                return frozenset({"podgroups", "workloads"})
            return frozenset()

    monkeypatch.setattr(kube, "Kube", NoApi)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setitem(main._state, "options", main.Options(metrics_port=0, workers=3))
    settings = kopf.OperatorSettings()
    memo = kopf.Memo()
    main.configure(settings=settings, memo=memo)
    try:
        assert settings.scanning.disabled and not settings.posting.enabled
        assert memo["controller"].workers == 3
        assert sorted(i.kind for i in memo["informers"]) == watched
        assert {i.namespace for i in memo["informers"] if i.kind != "ResourceFlavor"} == {"default"}
        assert memo["controller"].defaults.kueue is kueue_served
        assert memo["controller"].defaults.gang_provider == "kubernetes"
    finally:
        for each in memo["informers"]:
            each.stop()
        memo["controller"].stop()
        memo["events"].stop()


def test_the_trust_narrowing_flags_become_the_planners_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: dict[str, Any] = {}
    monkeypatch.setattr(main, "run", lambda options: captured.setdefault("options", options))
    allowed = ["--allowed-volume-types=persistentVolumeClaim,emptyDir", "--allowed-service-accounts=a,b"]
    cli.main(["operator", *allowed])
    assert captured["options"].policy() == admission.Policy(
        volume_types=frozenset({"persistentVolumeClaim", "emptyDir"}), service_accounts=frozenset({"a", "b"})
    )
    assert main.Options().policy() == admission.Policy()  # unset: everything the API allows
    from_env = main.Options.from_env(
        {"KUBETRAIN_ALLOWED_VOLUME_TYPES": "", "KUBETRAIN_ALLOWED_SERVICE_ACCOUNTS": "kubetrain-worker"}
    )
    assert from_env.policy() == admission.Policy(frozenset(), frozenset({"kubetrain-worker"}))


def test_an_unknown_volume_type_flag_is_refused_naming_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["operator", "--allowed-volume-types=nfs"])
    assert "persistentVolumeClaim, hostPath, emptyDir" in capsys.readouterr().err


def test_a_worker_cluster_role_without_the_account_to_bind_it_to_is_refused_naming_both_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as refused:
        cli.main(["operator", "--worker-cluster-role", "kubetrain-worker"])
    assert refused.value.code == 2
    assert "--worker-cluster-role needs --worker-service-account" in capsys.readouterr().err
