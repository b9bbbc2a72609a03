"""The numbers behind a step's report figures: Polars aggregations of the rows the build
already holds (`TrainBatch.report_rows`: the scalar shard columns in write order, each row's
prompt group and staleness), its manifest and its quarantine. Nothing is drawn here: the
tests check these numbers exactly, and the figures only draw them.

Each figure's numbers are a LazyFrame query, and `step_figures` collects them in two
batches (`pl.collect_all`): every query and the histograms' ranges, then the histograms'
bins, whose edges the first batch gives. Queries collected together share their common
parts (the prompt groups feed both their table and their range).
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import polars as pl

from pipeline import columns as c
from pipeline import trainers
from pipeline.manifest import Manifest

# Rows of the quarantine the page lists in full (the rest are counted by rule).
QUARANTINE_SHOWN = 20
# Polars' in-memory engine, the one eager frames use: the streaming one adds up a group's
# rewards in another order, so its means differ in their last bits (enough to move a group
# on a bin's edge to the next bin).
ENGINE: Final = "in-memory"
# Bins of the two histograms.
REWARD_BINS = 20
LENGTH_BINS = 24

REWARD = "reward"  # a row's raw reward, else its reward
GROUP_MEAN = "mean_reward"
GROUP_SIZE = "samples"
ONE_REWARD = "one_reward"
ROWS = "rows"
TOKENS = "tokens"
FLOPS = "flops"  # the planner's name (`pipeline.planner.FLOPS`), not imported: it pulls more
STALENESS = "staleness"
RULE = "rule"
# A histogram's columns: the bin, its marked and all rows, the ends of the finite range.
BIN = "bin"
MARKED = "marked"
TOTAL = "total"
LOW = "low"
HIGH = "high"


class Histogram(NamedTuple):
    """Equal bins over the finite range of a value, with the counts a title gives: every
    row, binned or not (a NaN or null mean reward has no bin), and how many are marked."""

    starts: list[float]  # each bin's lower end
    marked: list[int]  # its rows of the marked kind (one reward, truncated)
    total: list[int]  # all its rows
    rows: int
    marked_rows: int


class StepFigures(NamedTuple):
    """What the report of one step draws (tuples, as `Histogram`: a frozen dataclass is
    built by generated code when the module is imported, once per build)."""

    step: int
    groups: pl.DataFrame  # one row per prompt group: GROUP_MEAN, GROUP_SIZE, ONE_REWARD
    lengths: pl.DataFrame  # response_lengths, truncated: one row per written sample
    reward_bins: Histogram  # of `groups`' mean rewards, one-reward groups marked
    length_bins: Histogram  # of `lengths`, truncated samples marked
    ranks: pl.DataFrame  # one row per data-parallel rank: rank, ROWS, TOKENS (and FLOPS)
    staleness: pl.DataFrame  # STALENESS, ROWS: rows per weight-version lag (none: empty)
    rules: pl.DataFrame  # RULE, ROWS: quarantined rows per rule, most first
    quarantined: pl.DataFrame  # the first QUARANTINE_SHOWN quarantined rows: index, leaf, reason
    manifest: Manifest

    @property
    def has_flops(self) -> bool:
        """Whether the step was built with the model's shape (FLOPs per rank drawn)."""
        return FLOPS in self.ranks.columns


def group_rewards(rows: pl.LazyFrame) -> pl.LazyFrame:
    """Each prompt group's mean raw reward (before normalization: `raw_reward`, else
    `rewards`), size and whether its samples share one reward (they give GRPO no signal);
    rows without a group_index are one group, as miles counts them. Groups in order of
    first appearance."""
    reward = pl.col(REWARD)
    return (
        rows.select(c.REPORT_GROUP, pl.coalesce(c.RAW_REWARD, c.REWARDS).alias(REWARD))
        .group_by(c.REPORT_GROUP, maintain_order=True)
        .agg(
            reward.mean().alias(GROUP_MEAN),
            pl.len().alias(GROUP_SIZE),
            (reward == reward.first()).all().alias(ONE_REWARD),
        )
        .drop(c.REPORT_GROUP)
    )


def response_lengths(rows: pl.LazyFrame) -> pl.LazyFrame:
    """Every written sample's response length and whether it was truncated."""
    return rows.select(
        pl.col(c.RESPONSE_LENGTHS).cast(pl.Int64),
        pl.col(c.TRUNCATED).cast(pl.Boolean).fill_null(False),
    )


def value_range(rows: pl.LazyFrame, value: str, marked: str) -> pl.LazyFrame:
    """One row: every row (ROWS), those where `marked` holds (MARKED), and the ends of the
    finite range of `value` (LOW, HIGH; null where no value is finite)."""
    number = pl.col(value).cast(pl.Float64)
    finite = number.is_finite().fill_null(False)
    return rows.select(
        pl.len().cast(pl.Int64).alias(ROWS),
        pl.col(marked).cast(pl.Int64).sum().alias(MARKED),
        number.filter(finite).min().alias(LOW),
        number.filter(finite).max().alias(HIGH),
    )


def bin_counts(
    rows: pl.LazyFrame, value: str, marked: str, ends: pl.DataFrame, bins: int
) -> pl.LazyFrame:
    """Per bin (BIN) of `bins` equal bins over the range `ends` (a `value_range`; one bin
    where the range is one value), its rows where `marked` holds and all its rows (TOTAL);
    rows without a finite `value` have no bin."""
    # The range's ends and the bin width go in as numbers, as the eager code gave them:
    # computed as expressions of this query, Polars' arithmetic put a value on a bin's edge
    # (0.75 of 0..3 in 20 bins) in the bin below.
    low, high = ends.row(0)[2:]
    low, high = (0.0, 0.0) if low is None else (low, high)
    bins = bins if high > low else 1
    width = (high - low) / bins if high > low else 1.0
    index = ((pl.col(value) - low) / width).floor().cast(pl.Int64).clip(0, bins - 1)
    return (
        rows.filter(pl.col(value).cast(pl.Float64).is_finite().fill_null(False))
        .group_by(index.alias(BIN))
        .agg(
            pl.col(marked).cast(pl.Int64).sum().alias(MARKED),
            pl.len().cast(pl.Int64).alias(TOTAL),
        )
    )


def histogram(ends: pl.DataFrame, counts: pl.DataFrame, bins: int) -> Histogram:
    """The `Histogram` of a `value_range` and its `bin_counts` (a row per bin that has
    rows), read in Python."""
    rows, marked_rows, low, high = ends.row(0)
    shown = 0 if low is None else bins if high > low else 1
    width = (high - low) / bins if shown and high > low else 1.0
    marked, total = [0] * shown, [0] * shown
    for index, rows_marked, rows_binned in counts.rows():
        marked[index], total[index] = rows_marked, rows_binned
    return Histogram(
        starts=[low + i * width for i in range(shown)],
        marked=marked,
        total=total,
        rows=rows,
        marked_rows=marked_rows or 0,
    )


def histogram_of(rows: pl.DataFrame, value: str, marked: str, bins: int) -> Histogram:
    """The `Histogram` of `value` over `rows`, on its own (`step_figures` collects its two
    histograms' queries with the rest)."""
    ends = value_range(rows.lazy(), value, marked).collect(engine=ENGINE)
    counts = bin_counts(rows.lazy(), value, marked, ends, bins).collect(engine=ENGINE)
    return histogram(ends, counts, bins)


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


def rank_load(rows: pl.LazyFrame, dp_size: int, flops: pl.Series | None = None) -> pl.LazyFrame:
    """Rows and tokens (`total_lengths`) of each data-parallel rank, a rank without rows at
    0; and its FLOPs (the sum of `flops`, one per row) where they are given."""
    sums = [
        pl.len().cast(pl.Int64).alias(ROWS),
        pl.col(c.TOTAL_LENGTHS).cast(pl.Int64).sum().alias(TOKENS),
    ]
    if flops is not None:
        rows = rows.select(c.RANK, c.TOTAL_LENGTHS).with_columns(flops.alias(FLOPS))
        sums.append(pl.col(FLOPS).sum())
    zeros = [pl.col(ROWS, TOKENS).fill_null(0)]
    if flops is not None:  # as the planner fills a rank without rows
        zeros.append(pl.col(FLOPS).cast(pl.Float64).fill_null(0.0))
    return (
        pl.LazyFrame({c.RANK: pl.int_range(dp_size, eager=True)})
        .cast({c.RANK: rows.collect_schema()[c.RANK]})
        .join(rows.group_by(c.RANK).agg(sums), on=c.RANK, how="left")
        .with_columns(zeros)
        .sort(c.RANK)
    )


def staleness(rows: pl.LazyFrame) -> pl.LazyFrame:
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
    # a handful of rules, ordered in Python: UTF-8 bytes sort as their code points do
    ordered = sorted(manifest.quarantined_rules.items(), key=lambda rule: (-rule[1], rule[0]))
    return pl.DataFrame(
        {RULE: [rule for rule, _ in ordered], ROWS: [rows for _, rows in ordered]},
        schema={RULE: pl.String, ROWS: pl.Int64},
    )


def quarantine_rows(quarantine: pl.DataFrame | None) -> pl.LazyFrame:
    """The first quarantined rows with the reason each was set aside."""
    schema = {c.INDEX: pl.Int64, c.LEAF: pl.Int64, c.REASON: pl.String}
    if quarantine is None or c.REASON not in quarantine.columns:
        return pl.LazyFrame(schema=schema)
    return (
        quarantine.lazy()
        .head(QUARANTINE_SHOWN)
        .select(
            (
                pl.col(name).cast(dtype)
                if name in quarantine.columns
                else pl.lit(None, dtype=dtype)
            ).alias(name)
            for name, dtype in schema.items()
        )
    )


def step_figures(
    rows: pl.DataFrame, manifest: Manifest, quarantine: pl.DataFrame | None
) -> StepFigures:
    """Every figure's numbers of one step: its queries collected together, then the bins
    of its two histograms, whose edges the first collect gives."""
    frame = rows.lazy()
    group_query, length_query = group_rewards(frame), response_lengths(frame)
    groups, lengths, ranks, lags, quarantined, reward_ends, length_ends = pl.collect_all(
        [
            group_query,
            length_query,
            rank_load(frame, manifest.dp_size, row_flops(rows, manifest)),
            staleness(frame),
            quarantine_rows(quarantine),
            value_range(group_query, GROUP_MEAN, ONE_REWARD),
            value_range(length_query, c.RESPONSE_LENGTHS, c.TRUNCATED),
        ],
        engine=ENGINE,
    )
    reward_counts, length_counts = pl.collect_all(
        [
            bin_counts(groups.lazy(), GROUP_MEAN, ONE_REWARD, reward_ends, REWARD_BINS),
            bin_counts(lengths.lazy(), c.RESPONSE_LENGTHS, c.TRUNCATED, length_ends, LENGTH_BINS),
        ],
        engine=ENGINE,
    )
    return StepFigures(
        step=manifest.step,
        groups=groups,
        lengths=lengths,
        reward_bins=histogram(reward_ends, reward_counts, REWARD_BINS),
        length_bins=histogram(length_ends, length_counts, LENGTH_BINS),
        ranks=ranks,
        staleness=lags,
        rules=quarantine_rules(manifest),
        quarantined=quarantined,
        manifest=manifest,
    )
