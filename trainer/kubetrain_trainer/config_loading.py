"""Assemble a `TrainerConfig` from the operator's env JSON, a YAML/JSON file and CLI flags (torch-free).

Precedence, lowest first: KUBETRAIN_TRAINER_CONFIG (what the TrainingJob spec says), `--config FILE`
(a local run's file), then individual flags such as `--epochs` (the seed Job's `--epochs 10` must win).
Validation errors name every offending field by its dotted path, e.g. `optimizer.lr`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kubetrain_trainer import contract
from kubetrain_trainer.config import TrainerConfig
from kubetrain_trainer.failures import ConfigError


def deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`, recursing into nested mappings so `data.root` keeps `data.dataset`."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a YAML or JSON mapping (JSON is YAML, so one parser covers both)."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML/JSON: {error}") from error
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping, got {type(loaded).__name__}")
    return loaded


def read_env_config(env: Mapping[str, str]) -> dict[str, Any]:
    """The operator's JSON config from KUBETRAIN_TRAINER_CONFIG, or {} when unset."""
    raw = env.get(contract.TRAINER_CONFIG, "").strip()
    if not raw:
        return {}
    try:
        loaded = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{contract.TRAINER_CONFIG} is not valid JSON: {error}") from error
    if not isinstance(loaded, dict):
        raise ConfigError(f"{contract.TRAINER_CONFIG} must hold a JSON object, got {type(loaded).__name__}")
    return loaded


def describe_validation_error(error: ValidationError) -> str:
    """One clause per problem: `field.path: message (got value)`."""
    parts = []
    for problem in error.errors():
        location = ".".join(str(p) for p in problem["loc"]) or "(config)"
        got = f" (got {problem['input']!r})" if problem["type"] != "missing" and "input" in problem else ""
        if isinstance(problem.get("input"), dict):
            got = ""
        parts.append(f"{location}: {problem['msg']}{got}")
    return "invalid trainer config: " + "; ".join(parts)


def load_config(
    file: Path | None, overrides: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> TrainerConfig:
    """Merge the sources in precedence order and validate; a ConfigError names each bad field."""
    env = os.environ if env is None else env
    merged = read_env_config(env)
    if file is not None:
        merged = deep_merge(merged, read_config_file(file))
    merged = deep_merge(merged, overrides)
    try:
        return TrainerConfig.model_validate(merged)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error)) from error
