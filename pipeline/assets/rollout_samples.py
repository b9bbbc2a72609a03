"""The `rollout_samples` asset: a step's rows, read, typed and validated."""

import dagster as dg

from pipeline.assets import GROUP
from pipeline.orchestration.compute import StepCompute
from pipeline.orchestration.partitions import rollout_steps
from pipeline.orchestration.reporting import failures_reported
from pipeline.orchestration.resources import RolloutStorage
from pipeline.orchestration.run_config import BuildConfig


@dg.asset(partitions_def=rollout_steps, group_name=GROUP, kinds={"polars", "parquet"})
def rollout_samples(
    context: dg.AssetExecutionContext,
    config: BuildConfig,
    rollout_storage: RolloutStorage,
    step_compute: StepCompute,
) -> dg.MaterializeResult:
    """A rollout step's sample rows in batch order, typed to the contract and validated
    (row invariants and the rollout-id rule of session v2). An invalid step fails here,
    before anything is written, with the rows per rule and the first offending rows;
    with `on_invalid: quarantine` whole invalid trajectories are set aside instead.
    Staged as Parquet under `<output root>/.staging/rollout_samples/`."""
    with failures_reported(context):
        settings = rollout_storage.settings(config.overrides())
        return step_compute.materialize(context, rollout_storage.roots(), settings)
