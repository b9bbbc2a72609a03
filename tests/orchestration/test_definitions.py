"""The Dagster definitions load, and their structure is what this snapshot says.

A change to the asset graph (keys, deps, checks, partitions, sensors, schedules, jobs)
fails `test_asset_graph_matches_the_snapshot`; update EXPECTED in the same change.
"""

from __future__ import annotations

import enum
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import dagster as dg

from pipeline.assets import CODE_VERSION, GROUP
from pipeline.definitions import defs
from pipeline.orchestration.partitions import partition_key, rollout_steps, step_of
from pipeline.orchestration.run_config import BuildConfig
from pipeline.settings import setting_fields, setting_types

REPO = Path(__file__).resolve().parents[2]

EXPECTED: dict[str, Any] = {
    "assets": {
        "rollout_samples": {
            "deps": [],
            "group": "rollout_shards",
            "partitions": "rollout_steps",
            "kinds": ["parquet", "polars"],
            "code_version": CODE_VERSION,
            "automation_condition": "eager",
        },
        "train_batch": {
            "deps": ["rollout_samples"],
            "group": "rollout_shards",
            "partitions": "rollout_steps",
            "kinds": ["polars"],
            "code_version": CODE_VERSION,
            "automation_condition": "eager",
        },
        "training_shards": {
            "deps": ["train_batch"],
            "group": "rollout_shards",
            "partitions": "rollout_steps",
            "kinds": ["parquet"],
            "code_version": CODE_VERSION,
            "automation_condition": "eager",
        },
    },
    "checks": {
        "rollout_samples:step_keeps_every_rule": {"blocking": True, "partitions": "rollout_steps"},
        "training_shards:every_row_is_trained": {"blocking": False, "partitions": "rollout_steps"},
        "training_shards:manifest_counts_add_up": {"blocking": True, "partitions": "rollout_steps"},
        "training_shards:no_rows_quarantined": {"blocking": False, "partitions": "rollout_steps"},
        "training_shards:rank_files_match_manifest": {
            "blocking": True,
            "partitions": "rollout_steps",
        },
        "training_shards:rollouts_stay_in_one_train_step": {
            "blocking": True,
            "partitions": "rollout_steps",
        },
    },
    "jobs": {
        "rollout_step_job": {
            "assets": ["rollout_samples", "train_batch", "training_shards"],
            "partitions": "rollout_steps",
        }
    },
    "sensors": {
        "rollout_shards_automation_sensor": {
            "job": None,
            "default_status": "STOPPED",
            "minimum_interval_seconds": 60,
        },
        "rollout_steps_sensor": {
            "job": "rollout_step_job",
            "default_status": "STOPPED",
            "minimum_interval_seconds": 60,
        },
    },
    "schedules": {
        "stale_shards_schedule": {
            "job": "rollout_step_job",
            "cron": "0 * * * *",
            "default_status": "STOPPED",
        }
    },
    "resources": ["rollout_storage", "step_compute"],
}


def _partitions(definition: dg.PartitionsDefinition | None) -> str | None:
    if definition is None:
        return None
    assert isinstance(definition, dg.DynamicPartitionsDefinition)
    return definition.name


def graph_structure(definitions: dg.Definitions) -> dict[str, Any]:
    """The structure of the definitions as plain data."""
    assets = {
        spec.key.to_user_string(): {
            "deps": sorted(dep.asset_key.to_user_string() for dep in spec.deps),
            "group": spec.group_name,
            "partitions": _partitions(spec.partitions_def),
            "kinds": sorted(spec.kinds),
            "code_version": spec.code_version,
            "automation_condition": (
                spec.automation_condition.get_label() if spec.automation_condition else None
            ),
        }
        for spec in definitions.resolve_all_asset_specs()
    }
    checks = {
        f"{spec.asset_key.to_user_string()}:{spec.name}": {
            "blocking": spec.blocking,
            "partitions": _partitions(spec.partitions_def),
        }
        for assets_def in definitions.assets or []
        for spec in assets_def.check_specs
    }
    jobs = {}
    for job in definitions.resolve_all_job_defs():
        if job.name.startswith("__"):
            continue
        jobs[job.name] = {
            "assets": sorted(k.to_user_string() for k in job.asset_layer.selected_asset_keys),
            "partitions": _partitions(job.partitions_def),
        }
    sensors = {
        sensor.name: {
            # An automation condition sensor targets the assets' conditions, not a job.
            "job": (
                None
                if isinstance(sensor, dg.AutomationConditionSensorDefinition)
                else sensor.job_name
            ),
            "default_status": sensor.default_status.value,
            "minimum_interval_seconds": sensor.minimum_interval_seconds,
        }
        for sensor in sorted(definitions.sensors or [], key=lambda sensor: sensor.name)
    }
    schedules = {
        schedule.name: {
            "job": schedule.job_name,
            "cron": schedule.cron_schedule,
            "default_status": schedule.default_status.value,
        }
        for schedule in definitions.schedules or []
    }
    return {
        "assets": dict(sorted(assets.items())),
        "checks": dict(sorted(checks.items())),
        "jobs": jobs,
        "sensors": sensors,
        "schedules": schedules,
        "resources": sorted(definitions.resources or {}),
    }


def test_definitions_load() -> None:
    dg.Definitions.validate_loadable(defs)


def test_asset_graph_matches_the_snapshot() -> None:
    assert graph_structure(defs) == EXPECTED


def test_automation_condition_requests_a_newly_registered_step() -> None:
    """The automation sensor's evaluation: nothing while no step is registered, then all
    three assets of a step the sensor has just registered, then nothing again."""
    selection = dg.AssetSelection.groups(GROUP)
    keys = [spec.key for spec in defs.resolve_all_asset_specs()]
    with dg.instance_for_test() as instance:
        first = dg.evaluate_automation_conditions(
            defs=defs, instance=instance, asset_selection=selection
        )
        assert first.total_requested == 0
        instance.add_dynamic_partitions(rollout_steps.name, [partition_key(7)])
        second = dg.evaluate_automation_conditions(
            defs=defs, instance=instance, asset_selection=selection, cursor=first.cursor
        )
        assert {key: second.get_requested_partitions(key) for key in keys} == {
            key: {partition_key(7)} for key in keys
        }
        third = dg.evaluate_automation_conditions(
            defs=defs, instance=instance, asset_selection=selection, cursor=second.cursor
        )
        assert third.total_requested == 0


def test_every_asset_has_a_description() -> None:
    for spec in defs.resolve_all_asset_specs():
        assert spec.description, spec.key
    checks = [spec for assets_def in defs.assets or [] for spec in assets_def.check_specs]
    assert len(checks) == 6
    for spec in checks:
        assert spec.description, spec.name


def test_run_config_fields_are_the_setting_names() -> None:
    assert list(BuildConfig.model_fields) == [name for name, _, _ in setting_fields()]


def test_run_config_choices_are_the_settings_choices() -> None:
    for name, field in BuildConfig.model_fields.items():
        (choice_type,) = [a for a in typing.get_args(field.annotation) if a is not type(None)]
        if isinstance(choice_type, type) and issubclass(choice_type, enum.Enum):
            setting = typing.get_args(setting_types()[name])
            assert [member.value for member in choice_type] == list(setting), name


def test_partition_keys_are_zero_padded_steps() -> None:
    assert partition_key(42) == "00000042"
    assert step_of("00000042") == 42
    assert sorted(partition_key(s) for s in (10, 9, 100)) == [
        partition_key(s) for s in (9, 10, 100)
    ]


def test_dg_check_defs_passes_without_a_warning(tmp_path: Path) -> None:
    """`make test` runs `dg check defs` as here (the project's venv named as the active
    one, the instance configured as the Makefile configures it): it loads the definitions
    and prints no deprecation or other warning."""
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path),
        "VIRTUAL_ENV": str(Path(sys.executable).parents[1]),
    }
    dg_cli = Path(sys.executable).with_name("dg")
    done = subprocess.run(
        [str(dg_cli), "check", "defs"], cwd=REPO, env=env, capture_output=True, text=True
    )

    assert done.returncode == 0, done.stderr
    assert "All definitions loaded successfully." in done.stdout
    assert "warning" not in (done.stdout + done.stderr).lower()
