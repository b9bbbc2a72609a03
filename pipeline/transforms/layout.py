"""Where every kept row of a step goes: the layout the plan writes by (SEMANTICS 6 and 7).

Polars Series, so that the common path (strided or balanced ranks) plans without numpy;
only the rollout-side schedule (`trainers.miles.schedule`) computes with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

# `Layout.train_step` of a row the trainer never trains (null `train_step` in shards).
UNTRAINED = -1


@dataclass(frozen=True)
class Layout:
    """Where every kept row goes, in write order (rank 0's rows as it trains them, ...)."""

    order: pl.Series  # Int64 row positions of kept rows, in write order
    rank: pl.Series  # Int32, per entry of `order`, ascending
    train_step: pl.Series  # Int32, per entry of `order`; UNTRAINED for a row never trained
    micro_batch: pl.Series | None  # Int32, within rank and train step; None without schedule
    dropped: pl.Series  # Int64 positions of rows dropped with trailing rollouts, ascending
    num_rollouts: list[int]  # per train step
    num_microbatches: list[int] | None  # per train step and rank; None without schedule
    steps_per_rank: list[int]  # optimizer steps each rank runs

    @property
    def untrained(self) -> pl.Series:
        """Entries of `order` the trainer never trains."""
        return (self.train_step == UNTRAINED).arg_true()


def rank_bounds(rank: pl.Series, dp_size: int) -> list[int]:
    """Where each rank's entries start in a rank column in write order (ascending), and
    the end: rank r's entries are [bounds[r], bounds[r + 1])."""
    ranks = pl.Series(range(dp_size + 1), dtype=rank.dtype)
    bounds: list[int] = rank.search_sorted(ranks, side="left").to_list()
    return bounds


def rank_sizes(rank: pl.Series, dp_size: int) -> list[int]:
    """How many entries each rank has, in a rank column in write order."""
    bounds = rank_bounds(rank, dp_size)
    return [end - start for start, end in zip(bounds, bounds[1:], strict=False)]


def rows_within_ranks(rank: pl.Series, dp_size: int) -> pl.Series:
    """Each entry's place among its rank's entries (0, 1, ... in each rank), for a rank
    column in write order."""
    starts = pl.Series(rank_bounds(rank, dp_size)[:-1], dtype=pl.Int64)
    return pl.int_range(len(rank), dtype=pl.Int64, eager=True) - starts.gather(rank)
