"""The three assets of a rollout step, one spec per file, built together by `rollout_step`."""

from collections.abc import Sequence

import dagster as dg

from pipeline.orchestration.partitions import rollout_steps

GROUP = "rollout_shards"

CODE_VERSION = "1"
"""The code version of all three assets. Bump it in any change that alters what a step's
transforms produce (new columns, other values, another layout): Dagster then shows every
step materialized with the old version as stale ("code version changed") in the UI."""

AUTOMATION_CONDITION = dg.AutomationCondition.eager()
"""Declarative automation of the three assets: a `rollout_steps` partition the sensor has
just registered is newly missing, so `eager()` requests it (the three assets in one run);
a re-materialized upstream asset requests its downstream ones. Evaluated by
`rollout_shards_automation_sensor` (stopped by default, like the other sensor)."""


def step_asset(
    key: str, description: str, kinds: set[str], deps: Sequence[dg.AssetSpec] = ()
) -> dg.AssetSpec:
    """One of a step's three assets: partitioned by step, in the project's group, with
    the shared code version and automation condition."""
    return dg.AssetSpec(
        key,
        deps=deps,
        partitions_def=rollout_steps,
        group_name=GROUP,
        code_version=CODE_VERSION,
        automation_condition=AUTOMATION_CONDITION,
        kinds=kinds,
        description=description,
    )
