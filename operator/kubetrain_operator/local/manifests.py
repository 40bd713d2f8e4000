"""TrainingJob manifests read from files: `kubetrain validate -f` and `kubetrain run -f`.

Why: kubectl answers a document that is no mapping with "error validating data: invalid object to
validate", and the API server's refusals need a cluster. Here every problem is said in the manifest's
own terms (the file, the document's place in it, the field as the API server writes it), with the same
models the CRD is generated from, so what passes here passes `kubectl apply`'s schema too.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pydantic
import yaml

from kubetrain_operator import api
from kubetrain_operator.api import constants, fieldpaths


class ManifestError(ValueError):
    """A file or document that is no valid TrainingJob; the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class Document:
    """One YAML document of a file: its 1-based place, for messages, and its content."""

    path: Path
    index: int
    count: int
    content: Any

    @property
    def where(self) -> str:
        return str(self.path) if self.count == 1 else f"{self.path} (document {self.index})"


def read_documents(path: Path) -> list[Document]:
    """Every non-empty document of a YAML file (`---` separated)."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ManifestError(f"{path}: cannot read: {error.strerror}") from error
    try:
        contents = [content for content in yaml.safe_load_all(text) if content is not None]
    except yaml.YAMLError as error:
        raise ManifestError(f"{path}: not valid YAML: {error}") from error
    if not contents:
        raise ManifestError(f"{path}: is empty: expected a TrainingJob manifest")
    return [Document(path, i, len(contents), content) for i, content in enumerate(contents, start=1)]


def not_a_mapping(content: Any) -> str:
    """Why a document is no manifest, said in YAML's terms."""
    what = "a list" if isinstance(content, list) else f"a single value ({type(content).__name__})"
    return (
        f"the document is {what}, not a mapping: a TrainingJob starts with `apiVersion:` at the first "
        "column (not `- apiVersion:`, not indented)"
    )


def is_trainingjob(document: Document) -> bool:
    return isinstance(document.content, dict) and document.content.get("kind") == constants.KIND


def parse_trainingjob(document: Document) -> api.TrainingJob:
    """The document as a TrainingJob, or ManifestError naming the first fields that are wrong."""
    content = document.content
    if not isinstance(content, dict):
        raise ManifestError(f"{document.where}: {not_a_mapping(content)}")
    if content.get("kind") != constants.KIND:
        raise ManifestError(f"{document.where}: kind is {content.get('kind')!r}, expected {constants.KIND}")
    if content.get("apiVersion") != constants.API_VERSION:
        raise ManifestError(
            f"{document.where}: apiVersion is {content.get('apiVersion')!r}, expected {constants.API_VERSION}"
        )
    for part in ("metadata", "spec"):
        if not isinstance(content.get(part, {}), dict):
            raise ManifestError(f"{document.where}: {part}: expected a mapping")
    try:
        api.TrainingJobSpec.model_validate(content["spec"])
        return api.TrainingJob.model_validate(content)
    except pydantic.ValidationError as error:
        message = fieldpaths.spec_error(error)
        raise ManifestError(f"{document.where}: invalid TrainingJob: {message}") from error


def validate(paths: list[Path]) -> int:
    """CLI body of `kubetrain validate`: one line per TrainingJob; exit 1 when any is invalid."""
    failed = False
    for path in paths:
        try:
            documents = read_documents(path)
        except ManifestError as error:
            print(f"kubetrain validate: {error}", file=sys.stderr)
            failed = True
            continue
        for document in documents:
            if isinstance(document.content, dict) and not is_trainingjob(document):
                print(
                    f"{document.where}: kind {document.content.get('kind')!r}, not a TrainingJob: not checked"
                )
                continue
            try:
                job = parse_trainingjob(document)
            except ManifestError as error:
                print(f"kubetrain validate: {error}", file=sys.stderr)
                failed = True
                continue
            print(f"{document.where}: trainingjob/{job.metadata.get('name', '<no name>')} is valid")
    return 1 if failed else 0
