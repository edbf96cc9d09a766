"""RunConfig: defaults, YAML loading, overrides, and one-line errors naming the field."""

from __future__ import annotations

import pydantic
import pytest

from ledger.run_layout import DEFAULT_RUNS_DIR, RunLayout, default_ledger_url
from orchestrator.config import ConfigError, RunConfig


def test_defaults_suit_a_short_cpu_run():
    config = RunConfig()

    assert config.rollout_batch_size == 16
    assert config.n_samples_per_prompt == 8
    assert config.max_weight_staleness == 1
    assert config.async_unused_samples_handler == "retry"
    assert config.buffer_capacity == 32
    assert config.backend == "torch" and config.transport == "full"
    assert config.sync is False
    assert config.db is None  # the run directory's own SQLite file, see run_layout


def test_db_defaults_to_a_sqlite_file_under_runs():
    # The default is a run convention (ledger.run_layout), not a RunConfig method.
    assert default_ledger_url(DEFAULT_RUNS_DIR / "r1") == "sqlite:///runs/r1/ledger.db"
    layout = RunLayout.of(DEFAULT_RUNS_DIR, "cli-run")
    assert layout.ledger_url == "sqlite:///runs/cli-run/ledger.db"


def test_from_yaml_applies_file_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rollout_batch_size: 4\nmax-weight-staleness: null\nlr: 0.01\n")

    config = RunConfig.from_yaml(path, {"rollout-batch-size": 6, "seed": None, "num_cells": 3})

    assert config.rollout_batch_size == 6  # the override wins
    assert config.max_weight_staleness is None  # null in the file turns it off
    assert config.seed == 1234  # a None override is an unset CLI option
    assert config.num_cells == 3 and config.lr == 0.01


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"max_weight_staleness": -1}, "max_weight_staleness"),
        ({"rollout_batch_size": 0}, "rollout_batch_size"),
        ({"async_unused_samples_handler": "keep"}, "async_unused_samples_handler"),
        ({"async_data_buffer_capacity_factor": 0}, "async_data_buffer_capacity_factor"),
        ({"top_p": 1.5}, "top_p"),
        ({"backend": "jax"}, "backend"),
        ({"run_id": "../escape"}, "run_id"),
        ({"db": "runs/ledger.db"}, "db"),
        ({"no_such_option": 1}, "no_such_option"),
        ({"rollout_batch_size": 2, "num_cells": 3}, "rollout_batch_size"),
    ],
)
def test_invalid_value_fails_with_one_line_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_yaml(None, overrides)

    message = str(caught.value)
    assert message.startswith(f"{field}:")
    assert "\n" not in message
    assert isinstance(caught.value, ValueError)


def test_unreadable_or_malformed_file_names_the_file(tmp_path):
    missing = tmp_path / "missing.yaml"
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1, 2\n")
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")

    for path in (missing, broken, listed):
        with pytest.raises(ConfigError) as caught:
            RunConfig.from_yaml(path)
        assert str(path) in str(caught.value)
        assert "\n" not in str(caught.value)


def test_every_cell_needs_a_group_per_step():
    assert RunConfig(rollout_batch_size=3, num_cells=3).num_cells == 3

    with pytest.raises(pydantic.ValidationError, match="cannot feed 3 cells"):
        RunConfig(rollout_batch_size=2, num_cells=3)


def test_every_field_has_help_text():
    assert all(field.description for field in RunConfig.model_fields.values())


def test_config_is_frozen_and_forbids_extra_keys():
    config = RunConfig()
    with pytest.raises(pydantic.ValidationError):
        config.rollout_batch_size = 3  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        RunConfig(unknown=1)  # type: ignore[call-arg]
