"""Plan one step: trim, compute every shard column, lay the batch out across ranks.

The `train_batch` asset; the list columns stay in batch order until `write` gathers them.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, Violation, step_error
from pipeline.manifest import Counts, InputFile, Manifest
from pipeline.settings import Settings
from pipeline.step.ingest import SampleTable
from pipeline.transforms import samples as s
from pipeline.transforms.layout import UNTRAINED, Layout, rank_sizes, rows_within_ranks
from pipeline.transforms.metrics import layout_metrics, rollout_metrics
from pipeline.transforms.rewards import with_rewards
from pipeline.transforms.shard_columns import (
    light_shard_columns,
    loss_masks,
    optional_columns,
    optional_shard_columns,
    present_columns,
    raw_reward,
)
from pipeline.transforms.split import batch_layout
from pipeline.transforms.trim import is_compact, plan_trim


@dataclass
class RankRows:
    """The shard columns of a batch before the list columns are gathered into write order."""

    scalars: pl.DataFrame  # the scalar shard columns and `rank`, in write order
    inputs: pl.DataFrame  # the input columns the list shard columns come from, in batch order
    optional: list[str]  # optional input columns that go into shards, in shard order
    order: pl.Series  # the batch position of each row in write order

    def rows(self, start: int, length: int) -> pl.DataFrame:
        """Rows [start, start + length) in write order with every column, gathered."""
        picked = self.inputs[self.order.slice(start, length)]
        lists = picked.select(
            pl.col(c.TOKENS),
            loss_masks(picked),
            *optional_shard_columns(self.optional),
        )
        scalars = _compact(self.scalars, start, length)
        return pl.concat([scalars, lists], how="horizontal").select(*c.DATASET_COLUMNS)


def _compact(frame: pl.DataFrame, start: int, length: int) -> pl.DataFrame:
    """Rows [start, start + length) copied into buffers of their own. Polars sizes Parquet
    pages by a column's whole buffers, so a slice of a larger frame would be written with
    other page boundaries than the same rows held alone: every rank file is written from
    a copy, whichever path (CLI or staged Dagster batch) produced the rows."""
    return frame[pl.int_range(start, start + length, dtype=pl.Int64, eager=True)]


class TrainBatch:
    """The trimmed batch in write order with its shard columns and metadata (`train_batch`).

    `frame` holds every rank-file column (`c.DATASET_COLUMNS`), rank 0's rows first, each in
    training order. plan_batch hands over the list columns still in batch order (RankRows): `frame`
    gathers them on first use, while write_shards gathers one rank at a time, so a build
    never holds a second copy of the step's tokens.
    """

    def __init__(
        self,
        step: int,
        frame: pl.DataFrame | RankRows,
        meta: Manifest,
        quarantine: pl.DataFrame | None = None,
    ) -> None:
        self.step = step
        self.meta = meta
        self.quarantine = quarantine
        self._frame = frame if isinstance(frame, pl.DataFrame) else None
        self._rows = frame if isinstance(frame, RankRows) else None

    @property
    def frame(self) -> pl.DataFrame:
        if self._frame is None:
            assert self._rows is not None
            self._frame = self._rows.rows(0, self._rows.scalars.height)
            self._rows = None
        return self._frame

    @property
    def height(self) -> int:
        """Rows of `frame`, without gathering it."""
        return self._rows.scalars.height if self._rows is not None else self.frame.height

    @property
    def schema(self) -> pl.Schema:
        """Columns and types of `frame`, without gathering it (from no rows)."""
        return self._rows.rows(0, 0).schema if self._rows is not None else self.frame.schema

    def ranks(self) -> pl.Series:
        """The `rank` column, in write order."""
        scalars = self._rows.scalars if self._rows is not None else self.frame
        return scalars.get_column(c.RANK)

    def rows(self, start: int, length: int) -> pl.DataFrame:
        """Rows [start, start + length) of `frame`, without gathering the others."""
        if self._rows is not None:
            return self._rows.rows(start, length)
        return _compact(self.frame, start, length)


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


def _rows_named(light: pl.DataFrame, positions: pl.Series) -> Violation:
    """The (index, leaf) of the first rows at `positions` of the batch."""
    shown = light[positions.head(ROWS_NAMED)]
    rows = list(
        zip(
            shown.get_column(c.SAMPLE_INDICES).to_list(),
            shown.get_column(c.LEAF).to_list(),
            strict=True,
        )
    )
    return Violation(rule="", message="", rows=rows, n_rows=len(positions))


def _refuse_what_cannot_train(
    light: pl.DataFrame, layout: Layout, settings: Settings, step: int
) -> list[int]:
    """SEMANTICS 6.1: refuse a layout on which the trainer would hang (ranks running
    different numbers of steps) or crash (untrained rows under use_dynamic_batch_size);
    return the ranks holding rows it never trains."""
    ranks = layout.rank.gather(layout.untrained).unique().sort().to_list()
    local = settings.global_batch_size // settings.dp_size
    sizes = rank_sizes(layout.rank, settings.dp_size)
    if len(set(layout.steps_per_rank)) > 1:
        # the rows past the fewest steps any rank runs: where the ranks part ways
        local_row = rows_within_ranks(layout.rank, settings.dp_size)
        excess = (local_row >= min(layout.steps_per_rank) * local).arg_true()
        excess_ranks = layout.rank.gather(excess).unique().sort().to_list()
        violation = _rows_named(light, layout.order.gather(excess))
        violation.rule = "ranks_run_different_steps"
        violation.step = step
        violation.message = (
            f"ranks would run different numbers of optimizer steps "
            f"{layout.steps_per_rank} (rank sizes {sizes}, global_batch_size="
            f"{settings.global_batch_size} // dp_size={settings.dp_size} = {local} rows per "
            f"step and rank), so the trainer's collectives would hang on the "
            f"{len(excess)} rows on ranks {excess_ranks} past step "
            f"{min(layout.steps_per_rank)}: {AVOID_UNTRAINED}, "
            "or change global_batch_size or dp_size"
        )
        raise StepError([violation])
    if len(layout.untrained) and settings.use_dynamic_batch_size:
        violation = _rows_named(light, layout.order.gather(layout.untrained))
        violation.rule = "untrained_rows_with_dynamic_batch_size"
        violation.step = step
        violation.message = (
            f"{len(layout.untrained)} rows on ranks {ranks} fall past the last whole step of "
            f"{local} rows per rank, and with use_dynamic_batch_size the trainer asserts that "
            f"its micro-batches cover every row: {AVOID_UNTRAINED}, "
            "or turn off use_dynamic_batch_size"
        )
        raise StepError([violation])
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
    stats = rollout_metrics(frame.lazy(), reward, settings.advantage_estimator)
    stats |= layout_metrics(rows.scalars.lazy(), settings.dp_size, counts)
    meta = Manifest(
        step=step,
        settings=settings.to_dict(),
        inputs=[InputFile(**record) for record in samples.inputs],
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
