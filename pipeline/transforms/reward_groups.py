"""Reward groups kept whole: what quarantine and trimming may take out of a step without
changing how a remaining row's reward is normalized (SEMANTICS 5.4).

Every trainer normalizes rewards within groups of rows; which rows form a group is decided
on the step as it was ingested (`RewardGroups`, each trainer's profile says how). Taking a
row out changes the mean (and std) its group's other rows are normalized with, and under a
whole-batch group or positional groups (whose rule depends on the row count) the grouping
itself. So quarantine sets a touched group aside whole (`kept_whole`), refusing the step
when the group is the whole batch; and trimming that would cut a group refuses the step
(`trim_cuts_group`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import polars as pl

from pipeline import columns as c
from pipeline.columns import REASON, ROW_ID
from pipeline.errors import StepError, Violation

# The rule of a row set aside because its reward group lost a row to quarantine, and the
# rules of the refusals.
GROUP_RULE = "reward_group_kept_whole"
QUARANTINE_WHOLE_RULE = "quarantine_changes_reward_group"
TRIM_RULE = "trim_cuts_reward_group"
ROWS_NAMED = 10
_KEY = "_reward_group"
_ORIGIN = "_origin"

Kind = Literal["none", "group_index", "positional", "whole"]


@dataclass(frozen=True)
class RewardGroups:
    """How a trainer groups a step's rows for reward normalization, decided on the step as
    ingested: not at all (`none`: rewards are not normalized), by `group_index`, by
    position in runs of `width` rows (`positional`, on the ingested batch), or as one group
    of the whole batch (`whole`). `described` says which, for messages."""

    kind: Kind
    described: str
    width: int = 0

    def key(self) -> pl.Expr:
        """Each row's group (null: a group of its own) from its ingested position."""
        if self.kind == "group_index":
            return pl.col(c.GROUP_INDEX).cast(pl.Int64, strict=False)
        if self.kind == "positional":
            return pl.col(ROW_ID) // self.width
        if self.kind == "whole":
            return pl.lit(0, dtype=pl.Int64)
        return pl.lit(None, dtype=pl.Int64)


def every_row_grouped(frame: pl.DataFrame) -> bool:
    """Whether every row of `frame` has a group_index (a reward group of its own choosing)."""
    if c.GROUP_INDEX not in frame.columns:
        return frame.is_empty()
    return frame.get_column(c.GROUP_INDEX).null_count() == 0


def _named(frame: pl.DataFrame, rows: pl.DataFrame) -> list[tuple[int, int]]:
    shown = rows.head(ROWS_NAMED).join(frame, on=ROW_ID, how="left", maintain_order="left")
    return list(
        zip(shown.get_column(c.INDEX).to_list(), shown.get_column(c.LEAF).to_list(), strict=True)
    )


def kept_whole(
    frame: pl.DataFrame, failing: pl.DataFrame, groups: RewardGroups, step: int
) -> pl.DataFrame:
    """The rows of `frame` (the step as ingested, with ROW_ID) set aside with the failing
    rows' reward groups, closed over trajectories (a trajectory goes whole, and so does
    every group it touches): ROW_ID and REASON, naming the failing row that took the group.
    Raises when the group is the whole batch: taking any row out renormalizes every row."""
    empty = pl.DataFrame(schema={ROW_ID: pl.Int64, REASON: pl.String})
    if groups.kind == "none" or failing.is_empty():
        return empty
    origins = (
        failing.group_by(ROW_ID, maintain_order=True)
        .agg(pl.col(REASON).str.extract(r"^([^:]+):", 1).unique(maintain_order=True))
        .sort(ROW_ID)
    )
    if groups.kind == "whole":
        rules = sorted({r for rs in origins.get_column(REASON).to_list() for r in rs if r})
        raise StepError(
            [
                Violation(
                    QUARANTINE_WHOLE_RULE,
                    f"quarantining the {origins.height} invalid rows ({', '.join(rules)}) would "
                    f"change the reward normalization of every other row: {groups.described} "
                    "is one reward group; give every row its group_index, or fix the rows "
                    "(`rollout-shards validate` lists why)",
                    step=step,
                    rows=_named(frame, origins),
                    n_rows=origins.height,
                )
            ]
        )
    ungrouped = groups.kind == "group_index" and c.GROUP_INDEX not in frame.columns
    key = pl.lit(None, dtype=pl.Int64) if ungrouped else groups.key()
    rows = frame.select(ROW_ID, *c.TRAJECTORY, key.alias(_KEY))
    taken = origins.select(ROW_ID, pl.col(ROW_ID).alias(_ORIGIN))
    while True:
        marked = rows.join(taken, on=ROW_ID, how="left")
        # each group and trajectory touched, with the first failing row that reached it
        by_group = (
            marked.filter(pl.col(_ORIGIN).is_not_null() & pl.col(_KEY).is_not_null())
            .group_by(_KEY)
            .agg(pl.col(_ORIGIN).min().alias("_g"))
        )
        by_trajectory = (
            marked.filter(pl.col(_ORIGIN).is_not_null())
            .group_by(*c.TRAJECTORY)
            .agg(pl.col(_ORIGIN).min().alias("_t"))
        )
        grown = (
            rows.join(by_group, on=_KEY, how="left")
            .join(by_trajectory, on=list(c.TRAJECTORY), how="left", nulls_equal=True)
            .select(ROW_ID, pl.min_horizontal("_g", "_t").alias(_ORIGIN))
            .filter(pl.col(_ORIGIN).is_not_null())
        )
        if grown.height == taken.height:
            break
        taken = grown
    # the failing rows' own trajectories are quarantine's already (as their siblings)
    invalid = failing.get_column(ROW_ID).implode()
    own = rows.filter(pl.col(ROW_ID).is_in(invalid).any().over(c.TRAJECTORY)).get_column(ROW_ID)
    added = taken.filter(~pl.col(ROW_ID).is_in(own.implode()))
    if added.is_empty():
        return empty
    who = frame.select(ROW_ID, c.INDEX, c.LEAF).join(
        origins.rename({REASON: "_rules"}), on=ROW_ID, how="inner"
    )
    return (
        added.join(who, left_on=_ORIGIN, right_on=ROW_ID, how="left")
        .sort(ROW_ID)
        .select(
            ROW_ID,
            pl.format(
                "{}: its reward group ({}) lost row (index {}, leaf {}) to {}, so it is set "
                "aside whole (its rewards would be normalized without that row)",
                pl.lit(GROUP_RULE),
                pl.lit(groups.described),
                pl.col(c.INDEX),
                pl.col(c.LEAF),
                pl.col("_rules").list.join(", "),
            ).alias(REASON),
        )
    )


def trim_cuts_group(
    kept: pl.LazyFrame,
    trimmed: pl.LazyFrame,
    groups: RewardGroups,
    step: int,
    uncut: int | None = None,
) -> None:
    """Refuse a trim that would cut a reward group: some of its rows kept, some trimmed
    (`kept` and `trimmed`: light rows with INDEX, LEAF and POSITION); `uncut`, the largest
    global batch size whose trim cuts none (0: none does), is named as the way out."""
    if groups.kind == "none":
        return
    kept, trimmed = kept.with_columns(group_key(groups)), trimmed.with_columns(group_key(groups))
    cut = kept.join(trimmed.select(_KEY).unique(), on=_KEY, how="semi").collect()
    if groups.kind != "whole" and cut.is_empty():
        return
    rows = trimmed.collect()
    if rows.is_empty():
        return
    n_kept = kept.select(pl.len()).collect().item()
    fix = (
        "give every row its group_index (its prompt), or set disable_rollout_trim_samples"
        if groups.kind == "whole"
        else "choose a global_batch_size that ends on a group's edge"
        + (f" (--global-batch-size {uncut} is the largest)" if uncut else "")
        + ", or set disable_rollout_trim_samples"
    )
    raise StepError(
        [
            Violation(
                TRIM_RULE,
                f"trimming the last {rows.height} rows to whole global batches ({n_kept} rows "
                f"kept) would cut a reward group ({groups.described}), so the kept rows of "
                f"that group would be normalized without the trimmed ones: {fix}",
                step=step,
                rows=list(
                    zip(
                        rows.get_column(c.INDEX).head(ROWS_NAMED).to_list(),
                        rows.get_column(c.LEAF).head(ROWS_NAMED).to_list(),
                        strict=True,
                    )
                ),
                n_rows=rows.height,
            )
        ]
    )


def group_key(groups: RewardGroups) -> pl.Expr:
    """Each planned row's reward group from its batch position (`columns.POSITION`, the
    rows after quarantine: positional groups were set aside whole, so runs of `width` rows
    remain runs of `width`)."""
    if groups.kind == "positional":
        return (pl.col(c.POSITION) // groups.width).alias(_KEY)
    if groups.kind == "group_index":
        return pl.col(c.GROUP_INDEX).alias(_KEY)
    return pl.lit(0, dtype=pl.Int64).alias(_KEY)


def largest_uncut(light: pl.LazyFrame, groups: RewardGroups, n_rows: int, multiple: int) -> int:
    """The largest global batch size, a multiple of `multiple` up to `n_rows`, whose trim
    (the leading `n_rows // size * size` rows of `light`, planned rows in batch order) ends
    on a reward group's edge and so cuts no group; 0 when there is none. Advice for a
    refused trim, not the trim itself."""
    if n_rows < multiple:
        return 0
    sizes = pl.int_range(multiple, n_rows + 1, multiple, dtype=pl.Int64, eager=True)
    candidates = pl.LazyFrame({"_size": sizes}).with_columns(
        (n_rows // pl.col("_size") * pl.col("_size")).alias("_k")
    )
    if groups.kind == "none":
        return int(sizes[-1])
    if groups.kind == "whole":
        clean = candidates.filter(pl.col("_k") == n_rows)
    else:
        # a group on rows first..last is cut by keeping k rows when first < k <= last
        spans = (
            light.select(group_key(groups), pl.int_range(pl.len(), dtype=pl.Int64).alias("_at"))
            .filter(pl.col(_KEY).is_not_null())
            .group_by(_KEY)
            .agg(pl.col("_at").min().alias("_first"), pl.col("_at").max().alias("_last"))
            .filter(pl.col("_last") > pl.col("_first"))
        )
        edges = (
            pl.concat(
                [
                    spans.select((pl.col("_first") + 1).alias("_k"), pl.lit(1).alias("_d")),
                    spans.select((pl.col("_last") + 1).alias("_k"), pl.lit(-1).alias("_d")),
                ]
            )
            .group_by("_k")
            .agg(pl.col("_d").sum())
            .sort("_k")
            .select("_k", pl.col("_d").cum_sum().alias("_cutting"))
        )
        clean = (
            candidates.sort("_k")
            .join_asof(edges, on="_k", strategy="backward")
            .filter(pl.col("_cutting").fill_null(0) == 0)
        )
    return int(clean.select(pl.col("_size").max()).collect().item() or 0)
