"""The `kubetrain` entry point: CRD generation, trainer delegation, operator options."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
from kubetrain_operator import cli, crdgen, main

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


def test_the_operator_never_imports_torch() -> None:
    if "torch" in sys.modules:
        pytest.skip("torch was imported by another test in this process")
    import kubetrain_operator.controller
    import kubetrain_operator.handlers
    import kubetrain_operator.main  # noqa: F401

    assert "torch" not in sys.modules
