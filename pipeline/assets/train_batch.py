"""The `train_batch` asset: the trimmed batch with every shard column and its layout."""

from pipeline.assets import step_asset
from pipeline.assets.rollout_samples import rollout_samples
from pipeline.step import TRAIN_BATCH

train_batch = step_asset(
    TRAIN_BATCH,
    description=(
        "The step trimmed to whole optimizer batches, with normalized rewards, rollout mask "
        "sums and batch positions, laid out across data-parallel ranks, train steps and "
        "micro-batches in the order each rank trains. Settings the step's data cannot satisfy "
        "(fewer samples than one batch, say) fail here. Handed to `training_shards` in memory "
        "when both run together; staged under `.staging/train_batch/` otherwise."
    ),
    kinds={"polars"},
    deps=[rollout_samples],
)
