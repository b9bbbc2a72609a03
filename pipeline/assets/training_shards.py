"""The `training_shards` asset: the committed step folder a trainer reads."""

import dagster as dg

from pipeline.assets import AUTOMATION_CONDITION, CODE_VERSION, GROUP
from pipeline.assets.train_batch import train_batch
from pipeline.orchestration.partitions import rollout_steps
from pipeline.step import TRAINING_SHARDS

training_shards = dg.AssetSpec(
    TRAINING_SHARDS,
    deps=[train_batch],
    partitions_def=rollout_steps,
    group_name=GROUP,
    code_version=CODE_VERSION,
    automation_condition=AUTOMATION_CONDITION,
    kinds={"parquet"},
    description=(
        "`step=<N>/` under the output root: one `rank=<R>.parquet` per data-parallel rank, "
        "`quarantine.parquet` when rows were set aside, and `manifest.json`, written last. "
        "The folder is committed by one rename, so a trainer sees the whole step or none."
    ),
)
