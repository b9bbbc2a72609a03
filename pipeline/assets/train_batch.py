"""The `train_batch` asset: the trimmed batch with every shard column and its layout."""

import dagster as dg

from pipeline.assets import GROUP, staging
from pipeline.assets.reporting import batch_metadata, failures_reported
from pipeline.assets.rollout_samples import rollout_samples
from pipeline.build import plan_batch
from pipeline.partitions import rollout_steps, step_of
from pipeline.resources import RolloutStorage


@dg.asset(partitions_def=rollout_steps, deps=[rollout_samples], group_name=GROUP, kinds={"polars"})
def train_batch(
    context: dg.AssetExecutionContext, rollout_storage: RolloutStorage
) -> dg.MaterializeResult:
    """The step trimmed to whole optimizer batches, with normalized rewards, rollout mask
    sums and batch positions, laid out across data-parallel ranks, train steps and
    micro-batches in the order each rank trains. Settings the step's data cannot satisfy
    (fewer samples than one batch, say) fail here. Staged under `.staging/train_batch/`."""
    step = step_of(context.partition_key)
    with failures_reported(context):
        samples, settings = staging.load_samples(rollout_storage, step)
        batch = plan_batch(samples, settings)
        folder = staging.save_batch(rollout_storage, batch)
    counts = batch.meta["counts"]
    context.log.info(
        f"step {step}: {counts['trimmed']} trimmed, {counts['dropped']} dropped, "
        f"{counts['written']} to write in {batch.meta['num_train_steps']} train steps"
    )
    return dg.MaterializeResult(metadata=batch_metadata(batch, folder))
