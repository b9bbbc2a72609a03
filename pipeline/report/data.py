"""The numbers behind a step's report figures: small Polars aggregations of the rows the
build already holds (`TrainBatch.report_rows`: the scalar shard columns in write order, each
row's prompt group and staleness), its manifest and its quarantine. No figure library is
imported here: the tests check these numbers exactly, and the figures only draw them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from pipeline import columns as c
from pipeline import trainers
from pipeline.manifest import Manifest

# Rows of the quarantine the page lists in full (the rest are counted by rule).
QUARANTINE_SHOWN = 20

GROUP_MEAN = "mean_reward"
GROUP_SIZE = "samples"
ONE_REWARD = "one_reward"
ROWS = "rows"
TOKENS = "tokens"
FLOPS = "flops"  # the planner's name (`pipeline.planner.FLOPS`), not imported: it pulls more
STALENESS = "staleness"


@dataclass(frozen=True)
class StepFigures:
    """What the report of one step draws."""

    step: int
    groups: pl.DataFrame  # one row per prompt group: GROUP_MEAN, GROUP_SIZE, ONE_REWARD
    lengths: pl.DataFrame  # response_lengths, truncated: one row per written sample
    ranks: pl.DataFrame  # one row per data-parallel rank: rank, ROWS, TOKENS (and FLOPS)
    staleness: pl.DataFrame  # STALENESS, ROWS: rows per weight-version lag (none: empty)
    rules: pl.DataFrame  # rule, ROWS: quarantined rows per rule, most first
    quarantined: pl.DataFrame  # the first QUARANTINE_SHOWN quarantined rows: index, leaf, reason
    manifest: Manifest

    @property
    def has_flops(self) -> bool:
        """Whether the step was built with the model's shape (FLOPs per rank drawn)."""
        return FLOPS in self.ranks.columns


def group_rewards(rows: pl.DataFrame) -> pl.DataFrame:
    """Each prompt group's mean raw reward (before normalization: `raw_reward`, else
    `rewards`), size and whether its samples share one reward (they give GRPO no signal);
    rows without a group_index are one group, as miles counts them. Groups in order of
    first appearance."""
    reward = pl.coalesce(c.RAW_REWARD, c.REWARDS)
    return (
        rows.group_by(c.REPORT_GROUP, maintain_order=True)
        .agg(
            reward.mean().alias(GROUP_MEAN),
            pl.len().alias(GROUP_SIZE),
            (reward == reward.first()).all().alias(ONE_REWARD),
        )
        .drop(c.REPORT_GROUP)
    )


def response_lengths(rows: pl.DataFrame) -> pl.DataFrame:
    """Every written sample's response length and whether it was truncated."""
    return rows.select(
        pl.col(c.RESPONSE_LENGTHS).cast(pl.Int64),
        pl.col(c.TRUNCATED).cast(pl.Boolean).fill_null(False),
    )


class _Recorded:
    """A manifest's recorded settings read as attributes, as a trainer's FLOPs estimate
    reads its settings (a setting not recorded reads None: not given)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = settings

    def __getattr__(self, name: str) -> Any:
        return self._settings.get(name)


def row_flops(rows: pl.DataFrame, manifest: Manifest) -> pl.Series | None:
    """Each row's forward FLOPs by the step's trainer's estimate (`row_flops`, the code
    `rollout-shards plan` and `--balance-by-flops` run), from its `total_lengths` and the
    model's shape the step was built with; None without a shape (nothing computed)."""
    profile = trainers.profile(str(manifest.settings.get("trainer", trainers.DEFAULT)))
    # handed as a Series, which the estimate reads with numpy.asarray: a trainer without a
    # shape answers None first, so a build without one never imports numpy here
    lengths: Any = rows.get_column(c.TOTAL_LENGTHS).cast(pl.Int64)
    flops = profile.row_flops(lengths, _Recorded(manifest.settings))
    return None if flops is None else pl.Series(FLOPS, flops, dtype=pl.Float64)


def rank_load(rows: pl.DataFrame, dp_size: int, flops: pl.Series | None = None) -> pl.DataFrame:
    """Rows and tokens (`total_lengths`) of each data-parallel rank, a rank without rows at
    0; and its FLOPs (the sum of `flops`, one per row) where they are given."""
    sums = [
        pl.len().cast(pl.Int64).alias(ROWS),
        pl.col(c.TOTAL_LENGTHS).cast(pl.Int64).sum().alias(TOKENS),
    ]
    if flops is not None:
        rows = rows.select(c.RANK, c.TOTAL_LENGTHS).with_columns(flops.alias(FLOPS))
        sums.append(pl.col(FLOPS).sum())
    per_rank = rows.group_by(c.RANK).agg(sums)
    zeros = [pl.col(ROWS, TOKENS).fill_null(0)]
    if flops is not None:  # as the planner fills a rank without rows
        zeros.append(pl.col(FLOPS).cast(pl.Float64).fill_null(0.0))
    return (
        pl.DataFrame({c.RANK: pl.int_range(dp_size, eager=True)})
        .cast({c.RANK: rows.schema[c.RANK]})
        .join(per_rank, on=c.RANK, how="left")
        .with_columns(zeros)
        .sort(c.RANK)
    )


def staleness(rows: pl.DataFrame) -> pl.DataFrame:
    """Written rows per weight-version lag (the step less a row's oldest numeric weight
    version), smallest lag first; empty when no row has a numeric weight version."""
    return (
        rows.select(pl.col(c.REPORT_STALENESS).alias(STALENESS))
        .drop_nulls()
        .group_by(STALENESS)
        .agg(pl.len().cast(pl.Int64).alias(ROWS))
        .sort(STALENESS)
    )


def quarantine_rules(manifest: Manifest) -> pl.DataFrame:
    """Quarantined rows per rule (a row under each rule it broke), most rows first."""
    rules = manifest.quarantined_rules
    return pl.DataFrame(
        {"rule": list(rules), ROWS: list(rules.values())},
        schema={"rule": pl.String, ROWS: pl.Int64},
    ).sort([ROWS, "rule"], descending=[True, False])


def quarantine_rows(quarantine: pl.DataFrame | None) -> pl.DataFrame:
    """The first quarantined rows with the reason each was set aside."""
    schema = {c.INDEX: pl.Int64, c.LEAF: pl.Int64, c.REASON: pl.String}
    if quarantine is None or c.REASON not in quarantine.columns:
        return pl.DataFrame(schema=schema)
    return quarantine.head(QUARANTINE_SHOWN).select(
        (
            pl.col(name).cast(dtype) if name in quarantine.columns else pl.lit(None, dtype=dtype)
        ).alias(name)
        for name, dtype in schema.items()
    )


def step_figures(
    rows: pl.DataFrame, manifest: Manifest, quarantine: pl.DataFrame | None
) -> StepFigures:
    """Every figure's numbers of one step."""
    return StepFigures(
        step=manifest.step,
        groups=group_rewards(rows),
        lengths=response_lengths(rows),
        ranks=rank_load(rows, manifest.dp_size, row_flops(rows, manifest)),
        staleness=staleness(rows),
        rules=quarantine_rules(manifest),
        quarantined=quarantine_rows(quarantine),
        manifest=manifest,
    )
