"""Everything Dagster loads for rollout-shards (`workspace.yaml` points here)."""

from __future__ import annotations

import dagster as dg

from pipeline.assets.rollout_step import rollout_step
from pipeline.orchestration.compute import StepCompute
from pipeline.orchestration.jobs import rollout_step_job
from pipeline.orchestration.resources import RolloutStorage
from pipeline.orchestration.schedules import stale_shards_schedule
from pipeline.orchestration.sensors import rollout_shards_automation_sensor, rollout_steps_sensor

defs = dg.Definitions(
    assets=[rollout_step],
    jobs=[rollout_step_job],
    sensors=[rollout_steps_sensor, rollout_shards_automation_sensor],
    schedules=[stale_shards_schedule],
    resources={
        "rollout_storage": RolloutStorage.from_env(),
        "step_compute": StepCompute.from_env(),
    },
    # A step's three assets run one after another; separate processes would only add
    # seconds of start-up per run.
    executor=dg.in_process_executor,
)
