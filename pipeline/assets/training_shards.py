"""The `training_shards` asset: the committed step folder a trainer reads."""

from pipeline.assets import step_asset
from pipeline.assets.train_batch import train_batch
from pipeline.step import TRAINING_SHARDS

training_shards = step_asset(
    TRAINING_SHARDS,
    description=(
        "`step=<N>/` under the output root: one `rank=<R>.parquet` per data-parallel rank "
        "and `manifest.json`, written last; rows set aside go to "
        "`_quarantine/step=<N>.parquet` beside the step folders. The folder is committed by "
        "one rename, so a trainer sees the whole step or none. A refused step's partition "
        "shows why (rule, file, first rows) as an observation."
    ),
    kinds={"parquet"},
    deps=[train_batch],
)
