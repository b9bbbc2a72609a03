"""Plan one step: the trainer's plan (trim, rewards, layout: `pipeline.trainers`), then the
shard columns in write order, the counts, the rollout metrics and the manifest.

The `train_batch` asset; the list columns stay in batch order until `write` gathers them.
"""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline import trainers
from pipeline.errors import StepError
from pipeline.manifest import Counts, InputFile, Manifest
from pipeline.settings import Settings
from pipeline.step.tables import RankRows, SampleTable, TrainBatch
from pipeline.transforms import samples as s
from pipeline.transforms.layout import UNTRAINED, Layout
from pipeline.transforms.metrics import layout_metrics, rollout_metrics
from pipeline.transforms.reward_groups import every_row_grouped
from pipeline.transforms.shard_columns import optional_columns, present_columns


def _light(frame: pl.DataFrame, settings: Settings, step: int) -> pl.DataFrame:
    return s.light_frame(frame, settings.reward_key, step)


def _rank_rows(
    step: int,
    head: pl.DataFrame,
    light: pl.DataFrame,
    layout: Layout,
    optional: list[str],
    columns: tuple[str, ...],
) -> RankRows:
    """The scalar shard columns in write order (`columns`: the trainer's rank-file columns,
    those beyond `c.DATASET_COLUMNS` taken from the light frame). The list columns are left
    in batch order, to be gathered once, rank by rank, as they are written."""
    own = [name for name in columns if name not in c.DATASET_COLUMNS]
    train_step = layout.train_step.alias(c.TRAIN_STEP)
    micro_batch = (
        layout.micro_batch.alias(c.MICRO_BATCH)
        if layout.micro_batch is not None
        else pl.repeat(None, len(layout.order), dtype=pl.Int32, eager=True).alias(c.MICRO_BATCH)
    )
    scalars = light.select(
        c.BATCH_POSITION,
        c.RESPONSE_LENGTHS,
        c.TOTAL_LENGTHS,
        c.REWARDS,
        c.RAW_REWARD,
        c.TRUNCATED,
        c.SAMPLE_INDICES,
        c.ROLLOUT_IDS,
        c.ROLLOUT_MASK_SUMS,
        *own,
        pl.col(c.GROUP_INDEX).alias(c.REPORT_GROUP),
    )[layout.order].with_columns(
        pl.when(train_step != UNTRAINED).then(train_step).alias(c.TRAIN_STEP),
        micro_batch,
        layout.rank.alias(c.RANK),
        pl.lit(step, dtype=pl.Int64).alias(c.STEP),
        _staleness(head, step).gather(layout.order).alias(c.REPORT_STALENESS),
    )
    needed = [c.TOKENS, c.LOSS_MASK, c.RESPONSE_LENGTH, c.REMOVE_SAMPLE, *optional]
    inputs = head.select(name for name in needed if name in head.columns)
    return RankRows(
        scalars=scalars, inputs=inputs, optional=optional, order=layout.order, columns=columns
    )


def _staleness(head: pl.DataFrame, step: int) -> pl.Series:
    """How many weight versions each row's oldest numeric one lags `step` (the report's
    staleness; null for a row without one, or a step without weight versions)."""
    if c.WEIGHT_VERSIONS not in head.columns:
        return pl.repeat(None, head.height, dtype=pl.Int64, eager=True)
    # a version too large for Int64 is null here: the metrics refuse the step for it
    element = pl.element()
    numeric = pl.when(element.str.contains(r"^[0-9]+$")).then(element.str.to_integer(strict=False))
    oldest = pl.col(c.WEIGHT_VERSIONS).list.eval(numeric).list.min()
    return head.select(pl.lit(step, dtype=pl.Int64) - oldest).to_series()


def untrained_warning(meta: Manifest) -> str | None:
    """The warning line `build` and `validate` print for a step with untrained rows."""
    if not meta.counts.untrained:
        return None
    return (
        f"step {meta.step}: warning: {meta.counts.untrained} rows on ranks "
        f"{meta.untrained_ranks} are never trained (past each rank's last whole step of "
        f"global_batch_size // dp_size rows); the rollout-side schedule (cp_size) or "
        "trimming would train them"
    )


# A rule's name where a quarantine reason names it: at the start, after "; " between
# rules, or after a sibling's "sibling of an invalid leaf: ".
_RULE_NAMED = r"(?:^|; |leaf: )[a-z][a-z0-9_]*: "


def quarantined_rules(quarantine: pl.DataFrame | None) -> dict[str, int]:
    """Quarantined rows per rule their reasons name (a row under each of its rules)."""
    if quarantine is None or quarantine.is_empty():
        return {}
    counts = (
        quarantine.select(
            pl.int_range(pl.len()).alias("_row"),
            pl.col(c.REASON).str.extract_all(_RULE_NAMED).alias("_rule"),
        )
        .explode("_rule")
        .select("_row", pl.col("_rule").str.extract(r"([a-z][a-z0-9_]*): $", 1))
        .drop_nulls()
        .unique()
        .group_by("_rule")
        .agg(pl.len())
        .sort("_rule")
    )
    return dict(zip(counts.get_column("_rule"), counts.get_column("len"), strict=True))


def _grouped(samples: SampleTable) -> bool:
    """Whether every ingested row had a group_index: the valid rows and the quarantined."""
    quarantine = samples.quarantine
    return every_row_grouped(samples.frame) and (
        quarantine is None or every_row_grouped(quarantine)
    )


def plan_batch(samples: SampleTable, settings: Settings) -> TrainBatch:
    """The trainer's plan of the step (`pipeline.trainers`), every shard column and the
    manifest; the batch in write order."""
    step, frame = samples.step, samples.frame
    light = (samples.light if samples.light is not None else _light(frame, settings, step)).lazy()
    profile = trainers.profile(settings.trainer)
    try:
        groups = profile.reward_groups(settings, samples.ingested, _grouped(samples))
        plan = profile.plan(light, frame.schema, frame.height, settings, step, groups)
    except StepError as error:
        if samples.quarantine is not None:
            for violation in error.violations:
                violation.message += (
                    f" (left after quarantining {samples.quarantine.height} rows of invalid "
                    "trajectories; `rollout-shards validate` with on_invalid fail lists why)"
                )
        raise
    head = frame.head(plan.kept)
    layout, light_df = plan.layout, plan.light
    optional = optional_columns(head)
    rows = _rank_rows(step, head, light_df, layout, optional, profile.rank_columns)
    quarantined = samples.quarantine.height if samples.quarantine is not None else 0
    counts = Counts(
        ingested=samples.ingested,
        quarantined=quarantined,
        repaired=sum(samples.repaired.values()),
        trimmed=plan.trimmed,
        dropped=len(layout.dropped),
        written=len(layout.order),
        untrained=len(layout.untrained),
    )
    reward = s.reward_value(frame.schema, settings.reward_key, step)
    stats = rollout_metrics(
        head.lazy(),
        reward,
        settings.advantage_estimator,
        n_samples_per_prompt=settings.n_samples_per_prompt,
        step=step,
    )
    stats |= layout_metrics(rows.scalars.lazy(), settings.dp_size, counts)
    stats |= profile.set_aside_stats(samples.quarantine, settings)
    meta = Manifest(
        step=step,
        settings=settings.to_dict(),
        inputs=[InputFile.of(record) for record in samples.files],
        counts=counts,
        repaired=samples.repaired,
        is_compact=plan.is_compact,
        global_batch_size=plan.global_batch_size,
        dynamic_global_batch_size=plan.dynamic_global_batch_size,
        num_train_steps=len(layout.num_rollouts),
        num_rollouts=layout.num_rollouts,
        num_microbatches=layout.num_microbatches,
        equal_reward_groups=plan.equal_reward_groups,
        ignored_columns=samples.ignored_columns,
        present_columns=present_columns(optional),
        stats=stats,
        untrained_ranks=plan.untrained_ranks,
        quarantined_rules=quarantined_rules(samples.quarantine),
        dropped_positions=layout.dropped.to_list(),
        dropped_raw_reward=light_df.get_column(c.RAW_REWARD).gather(layout.dropped).to_list(),
    )
    return TrainBatch(step=step, frame=rows, meta=meta, quarantine=samples.quarantine)
