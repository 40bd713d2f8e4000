"""The operator imports the trainer's config, contract and CLI modules without having torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "module",
    [
        "kubetrain_trainer.config",
        "kubetrain_trainer.contract",
        "kubetrain_trainer.exit_codes",
        "kubetrain_trainer.termination",
        "kubetrain_trainer.config_loading",
        "kubetrain_trainer.cli",
    ],
)
def test_module_imports_without_importing_torch(module: str) -> None:
    code = f"import sys, {module}; sys.exit(1 if 'torch' in sys.modules else 0)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{module} imported torch: {result.stderr}"


def test_cli_help_and_config_errors_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from kubetrain_trainer import cli\n"
        "code = cli.main(['train', '--epochs', '0'])\n"
        "sys.exit(100 + code if 'torch' not in sys.modules else 1)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 102, result.stderr
    assert "epochs" in result.stderr
