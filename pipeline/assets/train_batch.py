"""The `train_batch` asset: the trimmed batch with every shard column and its layout."""

import dagster as dg

from pipeline.assets import GROUP
from pipeline.assets.rollout_samples import rollout_samples
from pipeline.orchestration.compute import StepCompute
from pipeline.orchestration.partitions import rollout_steps
from pipeline.orchestration.reporting import failures_reported
from pipeline.orchestration.resources import RolloutStorage


@dg.asset(partitions_def=rollout_steps, deps=[rollout_samples], group_name=GROUP, kinds={"polars"})
def train_batch(
    context: dg.AssetExecutionContext, rollout_storage: RolloutStorage, step_compute: StepCompute
) -> dg.MaterializeResult:
    """The step trimmed to whole optimizer batches, with normalized rewards, rollout mask
    sums and batch positions, laid out across data-parallel ranks, train steps and
    micro-batches in the order each rank trains. Settings the step's data cannot satisfy
    (fewer samples than one batch, say) fail here. Staged under `.staging/train_batch/`."""
    with failures_reported(context):
        return step_compute.materialize(context, rollout_storage.roots())
