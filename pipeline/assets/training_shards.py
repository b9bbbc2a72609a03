"""The `training_shards` asset: the committed step folder a trainer reads."""

import dagster as dg

from pipeline.assets import GROUP, staging
from pipeline.assets.reporting import failures_reported, shard_metadata
from pipeline.assets.train_batch import train_batch
from pipeline.build import write_shards
from pipeline.partitions import rollout_steps, step_of
from pipeline.resources import RolloutStorage


@dg.asset(partitions_def=rollout_steps, deps=[train_batch], group_name=GROUP, kinds={"parquet"})
def training_shards(
    context: dg.AssetExecutionContext, rollout_storage: RolloutStorage
) -> dg.MaterializeResult:
    """`step=<N>/` under the output root: one `rank=<R>.parquet` per data-parallel rank,
    `quarantine.parquet` when rows were set aside, and `manifest.json`, written last.
    The folder is committed by one rename, so a trainer sees the whole step or none."""
    step = step_of(context.partition_key)
    with failures_reported(context):
        batch = staging.load_batch(rollout_storage, step)
        manifest = write_shards(batch, rollout_storage.output_path)
    folder = rollout_storage.step_folder(step)
    context.log.info(f"step {step}: {manifest['counts']['written']} rows written to {folder}")
    return dg.MaterializeResult(metadata=shard_metadata(manifest, batch, folder))
