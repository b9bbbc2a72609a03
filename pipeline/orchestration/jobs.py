"""The job that builds one rollout step: its three assets and their checks."""

from __future__ import annotations

import dagster as dg

from pipeline.assets.rollout_samples import rollout_samples
from pipeline.assets.train_batch import train_batch
from pipeline.assets.training_shards import training_shards

rollout_step_job = dg.define_asset_job(
    name="rollout_step_job",
    selection=dg.AssetSelection.assets(rollout_samples.key, train_batch.key, training_shards.key),
    description="Build one rollout step into training shards; the partition is the step.",
)
