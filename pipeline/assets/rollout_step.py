"""`rollout_step`: the one Dagster step that builds a step's three assets.

Materialized together, the three assets are one session: in process the batch moves from
stage to stage in memory, behind Pipes one worker (subprocess, Ray job or pod) runs the
whole step and reports each asset. A subset (one asset re-materialized) runs only its
stages and reads or leaves the staged Parquet its neighbours need. The op keeps the name
`rollout_samples`, so run config stays `ops: {rollout_samples: {config: ...}}`.
"""

import warnings
from collections.abc import Iterator

import dagster as dg

from pipeline.assets.rollout_samples import rollout_samples
from pipeline.assets.train_batch import train_batch
from pipeline.assets.training_shards import training_shards
from pipeline.orchestration.checks import (
    SHARD_CHECKS,
    shard_check_results,
    step_kept_every_rule,
)
from pipeline.orchestration.compute import StepCompute
from pipeline.orchestration.reporting import (
    STEP_KEEPS_EVERY_RULE,
    failures_reported,
    rules_followed,
)
from pipeline.orchestration.resources import RolloutStorage
from pipeline.orchestration.run_config import BuildConfig
from pipeline.orchestration.step_pool import STEP_POOL, step_slot
from pipeline.step import ROLLOUT_SAMPLES

# A check per step (partitioned check specs are a preview feature of dagster 1.13, as in
# orchestration/checks.py): the UI shows each step's result rather than the latest's.
warnings.filterwarnings(
    "ignore",
    message="Specifying a partitions_def on an AssetCheckSpec",
    category=dg.PreviewWarning,
)


@dg.multi_asset(
    name=ROLLOUT_SAMPLES,
    specs=[rollout_samples, train_batch, training_shards],
    check_specs=[
        dg.AssetCheckSpec(
            STEP_KEEPS_EVERY_RULE,
            asset=rollout_samples.key,
            blocking=True,
            partitions_def=rollout_samples.partitions_def,
            description=(
                "The step keeps every rule of the contract: its rows', and the settings "
                "its data must satisfy (the rules the command line checks). Failed, with "
                "the rule lines and the offending rows, when the step is refused; nothing "
                "of it is then published."
            ),
        ),
        *(spec for spec, _ in SHARD_CHECKS),
    ],
    can_subset=True,
    pool=STEP_POOL,
)
def rollout_step(
    context: dg.AssetExecutionContext,
    config: BuildConfig,
    rollout_storage: RolloutStorage,
    step_compute: StepCompute,
) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
    """Read, validate, plan and write one rollout step, reporting each selected asset."""

    def stages() -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        if context.selected_asset_keys:
            with step_slot(context):
                settings = rollout_storage.settings(config.overrides())
                yield from step_compute.materialize(context, rollout_storage.roots(), settings)
            yield from rules_followed(context)
        else:
            yield from step_kept_every_rule(context, rollout_storage)
        # after the commit, or alone on a step built before ("Execute checks")
        yield from shard_check_results(context, rollout_storage)

    # the output root lazily: an output_root outside the roots fails in `stages` as one line
    yield from failures_reported(context, stages(), lambda: rollout_storage.output_path)
