"""Config sources merge in the documented order and invalid values are reported by field path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubetrain_trainer import config_loading
from kubetrain_trainer.failures import ConfigError

pytestmark = pytest.mark.unit


def test_flags_override_file_which_overrides_env(tmp_path: Path) -> None:
    env = {"KUBETRAIN_TRAINER_CONFIG": json.dumps({"epochs": 3, "data": {"dataset": "fake", "root": "/env"}})}
    file = tmp_path / "config.yaml"
    file.write_text("epochs: 5\ndata:\n  root: /file\noptimizer:\n  lr: 0.5\n")
    config = config_loading.load_config(file, {"epochs": 7}, env)
    assert config.epochs == 7
    assert config.data.root == "/file"
    assert config.data.dataset == "fake"  # nested keys from the env survive the file's data section
    assert config.optimizer.lr == 0.5


def test_every_invalid_field_is_named_with_its_path() -> None:
    env = {"KUBETRAIN_TRAINER_CONFIG": json.dumps({"epochs": 0, "optimizer": {"lr": -1}})}
    with pytest.raises(ConfigError) as raised:
        config_loading.load_config(None, {}, env)
    assert "epochs" in str(raised.value)
    assert "optimizer.lr" in str(raised.value)


def test_unknown_key_is_an_error_not_a_silent_default() -> None:
    env = {"KUBETRAIN_TRAINER_CONFIG": json.dumps({"optimiser": {"lr": 0.1}})}
    with pytest.raises(ConfigError, match="optimiser"):
        config_loading.load_config(None, {}, env)


def test_env_config_that_is_not_json_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="KUBETRAIN_TRAINER_CONFIG"):
        config_loading.load_config(None, {}, {"KUBETRAIN_TRAINER_CONFIG": "{epochs: 3"})


def test_simple_cnn_rejects_image_sizes_its_fc1_cannot_take() -> None:
    with pytest.raises(ConfigError, match="2304"):
        config_loading.load_config(None, {"data": {"image_size": 64}}, {})
