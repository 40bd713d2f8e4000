"""Where a result came from: the config, the code and the data, recorded in model.pt and metrics.json.

Any figure a run reports can then be traced to what produced it, even when the image was rebuilt or the
data volume changed since. The code is identified by a digest of the trainer's own source files, which
holds in a container without git; the git commit is added when the trainer runs from a checkout.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import subprocess
from pathlib import Path
from typing import Any

import torch

from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.datasets import DataOrigin

_PACKAGE_DIR = Path(__file__).resolve().parent


def source_sha256(package_dir: Path = _PACKAGE_DIR) -> str:
    """SHA-256 over the trainer package's Python files (relative name and content, in name order)."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(f"{path.relative_to(package_dir).as_posix()}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _git_commit(directory: Path) -> str | None:
    """HEAD of the git checkout holding `directory`, or None (no git, not a checkout)."""
    try:
        result = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def _package_version() -> str | None:
    try:
        return importlib.metadata.version("kubetrain")
    except importlib.metadata.PackageNotFoundError:
        return None


def code_version() -> dict[str, Any]:
    """The trainer's version, source digest and git commit (when known), and the torch version."""
    return {
        "version": _package_version(),
        "source_sha256": source_sha256(),
        "git_commit": _git_commit(_PACKAGE_DIR),
        "torch": str(torch.__version__),
    }


def record(
    config: TrainerConfig, origin: DataOrigin | None, train_images: int, validation_images: int
) -> dict[str, Any]:
    """`{"config", "code", "data"}`: the whole config, `code_version()`, and the data's origin and split."""
    data = origin.to_dict() if origin is not None else {}
    data.update({"train_images": train_images, "validation_images": validation_images})
    return {"config": config.model_dump(mode="json"), "code": code_version(), "data": data}
