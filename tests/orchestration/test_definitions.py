"""The Dagster definitions load, and their structure is what this snapshot says.

A change to the asset graph (keys, deps, checks, partitions, sensors, schedules, jobs)
fails `test_asset_graph_matches_the_snapshot`; update EXPECTED in the same change.
"""

from __future__ import annotations

import enum
import typing
from typing import Any

import dagster as dg

from pipeline.definitions import defs
from pipeline.orchestration.partitions import partition_key, step_of
from pipeline.orchestration.run_config import BuildConfig
from pipeline.settings import Settings

EXPECTED: dict[str, Any] = {
    "assets": {
        "rollout_samples": {
            "deps": [],
            "group": "rollout_shards",
            "partitions": "rollout_steps",
            "kinds": ["parquet", "polars"],
        },
        "train_batch": {
            "deps": ["rollout_samples"],
            "group": "rollout_shards",
            "partitions": "rollout_steps",
            "kinds": ["polars"],
        },
        "training_shards": {
            "deps": ["train_batch"],
            "group": "rollout_shards",
            "partitions": "rollout_steps",
            "kinds": ["parquet"],
        },
    },
    "checks": {
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
        "rollout_steps_sensor": {
            "job": "rollout_step_job",
            "default_status": "STOPPED",
            "minimum_interval_seconds": 60,
        }
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
        }
        for spec in definitions.resolve_all_asset_specs()
    }
    checks = {
        f"{spec.asset_key.to_user_string()}:{spec.name}": {
            "blocking": spec.blocking,
            "partitions": _partitions(spec.partitions_def),
        }
        for checks_def in definitions.asset_checks or []
        for spec in checks_def.check_specs
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
            "job": sensor.job_name,
            "default_status": sensor.default_status.value,
            "minimum_interval_seconds": sensor.minimum_interval_seconds,
        }
        for sensor in definitions.sensors or []
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


def test_every_asset_has_a_description() -> None:
    for spec in defs.resolve_all_asset_specs():
        assert spec.description, spec.key
    for checks_def in defs.asset_checks or []:
        for spec in checks_def.check_specs:
            assert spec.description, spec.name


def test_run_config_fields_are_the_setting_names() -> None:
    assert list(BuildConfig.model_fields) == list(Settings.model_fields)


def test_run_config_choices_are_the_settings_choices() -> None:
    for name, field in BuildConfig.model_fields.items():
        (choice_type,) = [a for a in typing.get_args(field.annotation) if a is not type(None)]
        if isinstance(choice_type, type) and issubclass(choice_type, enum.Enum):
            setting = typing.get_args(Settings.model_fields[name].annotation)
            assert [member.value for member in choice_type] == list(setting), name


def test_partition_keys_are_zero_padded_steps() -> None:
    assert partition_key(42) == "00000042"
    assert step_of("00000042") == 42
    assert sorted(partition_key(s) for s in (10, 9, 100)) == [
        partition_key(s) for s in (9, 10, 100)
    ]
