"""The three assets of a rollout step, one spec per file, built together by `rollout_step`."""

import dagster as dg

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
