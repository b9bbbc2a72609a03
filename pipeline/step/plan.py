"""Plan one step: trim, compute every shard column, lay the batch out across ranks.

The `train_batch` asset; the list columns stay in batch order until `write` gathers them.
"""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, Violation, step_error
from pipeline.manifest import Counts, InputFile, Manifest
from pipeline.settings import Settings
from pipeline.step.tables import RankRows, SampleTable, TrainBatch
from pipeline.transforms import samples as s
from pipeline.transforms.layout import UNTRAINED, Layout, rank_sizes, rows_within_ranks
from pipeline.transforms.metrics import layout_metrics, rollout_metrics
from pipeline.transforms.rewards import with_rewards
from pipeline.transforms.shard_columns import (
    light_shard_columns,
    optional_columns,
    present_columns,
    raw_reward,
)
from pipeline.transforms.split import batch_layout
from pipeline.transforms.trim import is_compact, plan_trim


def _light(frame: pl.DataFrame, settings: Settings, step: int) -> pl.DataFrame:
    return s.light_frame(frame, settings.reward_key, step)


def _rank_rows(
    step: int, head: pl.DataFrame, light: pl.DataFrame, layout: Layout, optional: list[str]
) -> RankRows:
    """The scalar shard columns in write order. The list columns are left in batch order,
    to be gathered once, rank by rank, as they are written."""
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
    )[layout.order].with_columns(
        pl.when(train_step != UNTRAINED).then(train_step).alias(c.TRAIN_STEP),
        micro_batch,
        layout.rank.alias(c.RANK),
        pl.lit(step, dtype=pl.Int64).alias(c.STEP),
    )
    needed = [c.TOKENS, c.LOSS_MASK, c.RESPONSE_LENGTH, c.REMOVE_SAMPLE, *optional]
    inputs = head.select(name for name in needed if name in head.columns)
    return RankRows(scalars=scalars, inputs=inputs, optional=optional, order=layout.order)


def _check_every_rank_has_rows(ranks: pl.Series, dp_size: int, step: int) -> None:
    """A rank without rows would get an empty shard file: the settings ask for more ranks
    than the step has rows to give."""
    filled = ranks.n_unique()
    if filled < dp_size:
        raise step_error(
            "not_enough_samples_for_dp_size",
            f"dp_size {dp_size} is larger than the step can fill: {len(ranks)} rows "
            f"written reach only {filled} rank(s), so rank files would be empty; "
            "lower dp_size or raise global_batch_size",
            step,
        )


ROWS_NAMED = 10
AVOID_UNTRAINED = (
    "set cp_size (with micro_batch_size or use_dynamic_batch_size) for the rollout-side "
    "schedule, or keep trimming on (drop disable_rollout_trim_samples)"
)


def _refusal(
    light: pl.DataFrame, positions: pl.Series, rule: str, step: int, message: str
) -> StepError:
    """A step refused by `rule`, naming the (index, leaf) of the first rows at `positions`
    of the batch."""
    shown = light[positions.head(ROWS_NAMED)]
    rows = list(
        zip(
            shown.get_column(c.SAMPLE_INDICES).to_list(),
            shown.get_column(c.LEAF).to_list(),
            strict=True,
        )
    )
    return StepError([Violation(rule, message, step=step, rows=rows, n_rows=len(positions))])


def _refuse_what_cannot_train(
    light: pl.DataFrame, layout: Layout, settings: Settings, step: int
) -> list[int]:
    """SEMANTICS 6.1: refuse a layout on which the trainer would train nothing (no whole
    optimizer step), hang (ranks running different numbers of steps) or crash (untrained
    rows under use_dynamic_batch_size); return the ranks holding rows it never trains."""
    ranks = layout.rank.gather(layout.untrained).unique().sort().to_list()
    local = settings.global_batch_size // settings.dp_size
    sizes = rank_sizes(layout.rank, settings.dp_size)
    if not layout.num_rollouts:
        raise _refusal(
            light,
            layout.order.gather(layout.untrained),
            "no_train_steps",
            step,
            f"the trainer would run 0 optimizer steps on this step: its {len(layout.order)} "
            f"rows fill no rank's first step of global_batch_size={settings.global_batch_size}"
            f" // dp_size={settings.dp_size} = {local} rows per rank (rank sizes {sizes}); "
            "lower global_batch_size, or set cp_size for the rollout-side schedule",
        )
    if len(set(layout.steps_per_rank)) > 1:
        # the rows past the fewest steps any rank runs: where the ranks part ways
        local_row = rows_within_ranks(layout.rank, settings.dp_size)
        excess = (local_row >= min(layout.steps_per_rank) * local).arg_true()
        excess_ranks = layout.rank.gather(excess).unique().sort().to_list()
        raise _refusal(
            light,
            layout.order.gather(excess),
            "ranks_run_different_steps",
            step,
            f"ranks would run different numbers of optimizer steps "
            f"{layout.steps_per_rank} (rank sizes {sizes}, global_batch_size="
            f"{settings.global_batch_size} // dp_size={settings.dp_size} = {local} rows per "
            f"step and rank), so the trainer's collectives would hang on the "
            f"{len(excess)} rows on ranks {excess_ranks} past step "
            f"{min(layout.steps_per_rank)}: {AVOID_UNTRAINED}, "
            "or change global_batch_size or dp_size",
        )
    if len(layout.untrained) and settings.use_dynamic_batch_size:
        raise _refusal(
            light,
            layout.order.gather(layout.untrained),
            "untrained_rows_with_dynamic_batch_size",
            step,
            f"{len(layout.untrained)} rows on ranks {ranks} fall past the last whole step of "
            f"{local} rows per rank, and with use_dynamic_batch_size the trainer asserts that "
            f"its micro-batches cover every row: {AVOID_UNTRAINED}, "
            "or turn off use_dynamic_batch_size",
        )
    return [int(rank) for rank in ranks]


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


def plan_batch(samples: SampleTable, settings: Settings) -> TrainBatch:
    """Trim, compute every shard column and the layout; the batch in write order."""
    step, frame = samples.step, samples.frame
    light = (samples.light if samples.light is not None else _light(frame, settings, step)).lazy()
    compact = is_compact(light)
    try:
        trim = plan_trim(frame.height, settings, compact, step)
    except StepError as error:
        if samples.quarantine is not None:
            for violation in error.violations:
                violation.message += (
                    f" (left after quarantining {samples.quarantine.height} rows of invalid "
                    "trajectories; `rollout-shards validate` with on_invalid fail lists why)"
                )
        raise
    head = frame.head(trim.kept)
    light = light_shard_columns(light.head(trim.kept)).with_columns(raw_reward(frame.schema))
    light, equal_groups = with_rewards(light, trim.kept, settings)
    light_df = light.collect()
    effective = settings.replace(global_batch_size=trim.global_batch_size)
    layout = batch_layout(light_df, effective)
    _check_every_rank_has_rows(layout.rank, settings.dp_size, step)
    untrained_ranks = _refuse_what_cannot_train(light_df, layout, effective, step)
    optional = optional_columns(head)
    rows = _rank_rows(step, head, light_df, layout, optional)
    quarantined = samples.quarantine.height if samples.quarantine is not None else 0
    counts = Counts(
        ingested=samples.ingested,
        quarantined=quarantined,
        repaired=sum(samples.repaired.values()),
        trimmed=trim.trimmed,
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
    meta = Manifest(
        step=step,
        settings=settings.to_dict(),
        inputs=[InputFile(**record) for record in samples.files],
        counts=counts,
        repaired=samples.repaired,
        is_compact=compact,
        global_batch_size=trim.global_batch_size,
        dynamic_global_batch_size=trim.dynamic_global_batch_size,
        num_train_steps=len(layout.num_rollouts),
        num_rollouts=layout.num_rollouts,
        num_microbatches=layout.num_microbatches,
        equal_reward_groups=equal_groups,
        ignored_columns=samples.ignored_columns,
        present_columns=present_columns(optional),
        stats=stats,
        untrained_ranks=untrained_ranks,
        dropped_positions=layout.dropped.to_list(),
        dropped_raw_reward=light_df.get_column(c.RAW_REWARD).gather(layout.dropped).to_list(),
    )
    return TrainBatch(step=step, frame=rows, meta=meta, quarantine=samples.quarantine)
