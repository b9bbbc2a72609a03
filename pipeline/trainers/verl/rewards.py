"""verl's GRPO advantage (`compute_grpo_outcome_advantage`, no KL in the reward): each
row's score against its uid group's mean, divided by its std + 1e-6 when
`norm_adv_by_std_in_grpo`, in float32 and in the rows' order after balancing (torch's sums
depend on it); a group of one row has mean 0 and std 1."""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.transforms.torch_float import torch_mean_std

# compute_grpo_outcome_advantage's epsilon, added to the std in float32
EPSILON = 1e-6
WRITE = "_write"


def grpo_advantages(written: pl.DataFrame, n: int, norm_by_std: bool) -> pl.Series:
    """compute_grpo_outcome_advantage's scalar per row of `written` (rows in the order verl
    holds them): the float32 score against its group's torch mean (and std + 1e-6)."""
    score = (pl.col(c.REWARD_VALUE).cast(pl.Float32) + pl.lit(0.0, dtype=pl.Float32)).alias(
        "score"
    )  # the row's sum: a -0.0 score sums to 0.0
    grouped = written.select(pl.int_range(pl.len()).alias(WRITE), c.GROUP_INDEX, score).sort(
        c.GROUP_INDEX, WRITE
    )
    values = grouped.get_column("score")
    rows = grouped.height
    if n == 1:
        mean = pl.repeat(0.0, rows, dtype=pl.Float32, eager=True)
        std = pl.repeat(1.0, rows, dtype=pl.Float32, eager=True)
    else:
        group_mean, group_std = torch_mean_std(values, n)
        member = pl.int_range(rows, dtype=pl.Int64, eager=True) // n
        mean, std = group_mean.gather(member), group_std.gather(member)
    centered = values - mean
    if norm_by_std:
        # every division by a Series: Polars multiplies by a scalar's reciprocal
        centered = centered / (std + pl.repeat(EPSILON, rows, dtype=pl.Float32, eager=True))
    return (
        grouped.select(pl.col(WRITE)).with_columns(centered.alias(c.REWARDS)).sort(WRITE)[c.REWARDS]
    )


def step_rewards(frame: pl.DataFrame, order: pl.Series, n: int, norm_by_std: bool) -> pl.Series:
    """`rewards` (float64 of the float32 advantage) per row of `frame`, the advantages
    computed with the rows in `order`, as verl holds them after balancing."""
    advantages = grpo_advantages(frame[order], n, norm_by_std)
    rewards = pl.repeat(0.0, frame.height, dtype=pl.Float32, eager=True).scatter(order, advantages)
    return rewards.cast(pl.Float64).alias(c.REWARDS)


def equal_reward_groups(frame: pl.DataFrame) -> int:
    """How many uid groups of more than one row hold a single score (advantages all 0)."""
    sizes = frame.group_by(c.GROUP_INDEX).agg(
        pl.len().alias("rows"), pl.col(c.REWARD_VALUE).n_unique().alias("values")
    )
    return sizes.filter((pl.col("rows") > 1) & (pl.col("values") == 1)).height
