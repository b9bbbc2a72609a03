"""The `train_batch` asset: the trimmed batch with every shard column and its layout."""

import dagster as dg

from pipeline.assets import AUTOMATION_CONDITION, CODE_VERSION, GROUP
from pipeline.assets.rollout_samples import rollout_samples
from pipeline.orchestration.partitions import rollout_steps
from pipeline.step import TRAIN_BATCH

train_batch = dg.AssetSpec(
    TRAIN_BATCH,
    deps=[rollout_samples],
    partitions_def=rollout_steps,
    group_name=GROUP,
    code_version=CODE_VERSION,
    automation_condition=AUTOMATION_CONDITION,
    kinds={"polars"},
    description=(
        "The step trimmed to whole optimizer batches, with normalized rewards, rollout mask "
        "sums and batch positions, laid out across data-parallel ranks, train steps and "
        "micro-batches in the order each rank trains. Settings the step's data cannot satisfy "
        "(fewer samples than one batch, say) fail here. Handed to `training_shards` in memory "
        "when both run together; staged under `.staging/train_batch/` otherwise."
    ),
)
