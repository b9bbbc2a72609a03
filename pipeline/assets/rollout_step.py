"""`rollout_step`: the one Dagster step that builds a step's three assets.

Materialized together, the three assets are one session: in process the batch moves from
stage to stage in memory, behind Pipes one worker (subprocess, Ray job or pod) runs the
whole step and reports each asset. A subset (one asset re-materialized) runs only its
stages and reads or leaves the staged Parquet its neighbours need. The op keeps the name
`rollout_samples`, so run config stays `ops: {rollout_samples: {config: ...}}`.
"""

from collections.abc import Iterator

import dagster as dg

from pipeline.assets.rollout_samples import rollout_samples
from pipeline.assets.train_batch import train_batch
from pipeline.assets.training_shards import training_shards
from pipeline.orchestration.compute import StepCompute
from pipeline.orchestration.reporting import failures_reported
from pipeline.orchestration.resources import RolloutStorage
from pipeline.orchestration.run_config import BuildConfig
from pipeline.orchestration.step_pool import STEP_POOL, step_slot
from pipeline.step import ROLLOUT_SAMPLES


@dg.multi_asset(
    name=ROLLOUT_SAMPLES,
    specs=[rollout_samples, train_batch, training_shards],
    can_subset=True,
    pool=STEP_POOL,
)
def rollout_step(
    context: dg.AssetExecutionContext,
    config: BuildConfig,
    rollout_storage: RolloutStorage,
    step_compute: StepCompute,
) -> Iterator[dg.MaterializeResult]:
    """Read, validate, plan and write one rollout step, reporting each selected asset."""
    with failures_reported(context, rollout_storage.output_path), step_slot(context):
        settings = rollout_storage.settings(config.overrides())
        yield from step_compute.materialize(context, rollout_storage.roots(), settings)
