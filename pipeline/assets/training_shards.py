"""The `training_shards` asset: the committed step folder a trainer reads."""

import dagster as dg

from pipeline.assets import GROUP
from pipeline.assets.train_batch import train_batch
from pipeline.orchestration.compute import StepCompute
from pipeline.orchestration.partitions import rollout_steps
from pipeline.orchestration.reporting import failures_reported
from pipeline.orchestration.resources import RolloutStorage


@dg.asset(partitions_def=rollout_steps, deps=[train_batch], group_name=GROUP, kinds={"parquet"})
def training_shards(
    context: dg.AssetExecutionContext, rollout_storage: RolloutStorage, step_compute: StepCompute
) -> dg.MaterializeResult:
    """`step=<N>/` under the output root: one `rank=<R>.parquet` per data-parallel rank,
    `quarantine.parquet` when rows were set aside, and `manifest.json`, written last.
    The folder is committed by one rename, so a trainer sees the whole step or none."""
    with failures_reported(context):
        return step_compute.materialize(context, rollout_storage.roots())
