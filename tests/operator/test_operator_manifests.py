"""`kubetrain validate`: every problem of a manifest file named by file, document and field, where
kubectl would only say "invalid object to validate"."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubetrain_operator import cli

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VALID = "apiVersion: kubetrain.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: ok}\nspec: {workers: 2, command: [python]}\n"


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("- apiVersion: kubetrain.io/v1alpha1\n  kind: TrainingJob\n", "the document is a list, not a mapping"),
        ("  just words\n", "a single value (str), not a mapping: a TrainingJob starts with `apiVersion:`"),
        ("", "is empty: expected a TrainingJob manifest"),
        ("{ not yaml", "not valid YAML"),
        ("apiVersion: kubeflow.org/v1\nkind: TrainingJob\nspec: {}\n", "apiVersion is 'kubeflow.org/v1'"),
        ("apiVersion: kubetrain.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: x}\nspec: [workers]\n",
         "spec: expected a mapping"),
        (VALID + "---\n" + VALID.replace("workers: 2", "workers: 0"), "(document 2): invalid TrainingJob: spec.workers"),
        (VALID.replace("command: [python]", "command: [python], env: [{name: PET_NNODES, value: '4'}]"),
         "spec.env[0].name: Value error, env name PET_NNODES is reserved"),
    ],
)  # fmt: skip
def test_a_bad_manifest_is_refused_naming_file_document_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, said: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(content)
    assert cli.main(["validate", "-f", str(path)]) == 1
    error = capsys.readouterr().err
    assert f"kubetrain validate: {path}" in error
    assert said in error
    assert "invalid object to validate" not in error


def test_valid_trainingjobs_pass_and_other_kinds_are_listed_not_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    storage, job = EXAMPLES / "quickstart-storage.yaml", EXAMPLES / "cifar10-cpu.yaml"
    assert cli.main(["validate", "-f", str(storage), "-f", str(job)]) == 0
    out = capsys.readouterr().out
    assert f"{storage} (document 3): kind 'Pod', not a TrainingJob: not checked" in out
    assert f"{job}: trainingjob/cifar10-cpu is valid" in out
