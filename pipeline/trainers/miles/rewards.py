"""Reward normalization within groups of rollouts (SEMANTICS section 5), in float32 as
torch computes it; which groups, and whether to scale by the std, is the trainer's
(`pipeline.trainers`)."""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.columns import GROUP, ROLLOUT_REWARD
from pipeline.transforms.torch_float import grouped_mean_std

EPS = 1e-6


def normalized_rollout_rewards(rollouts: pl.DataFrame, use_std: bool) -> pl.DataFrame:
    """One float32 value per (group, rollout key): centred, optionally scaled by the std.

    `rollouts` lists each group's rollouts together, in order of first appearance; the
    group means and stds are torch's bits (transforms.torch_float). Groups being runs of
    rows, each group's size, least and greatest reward are taken per run and gathered back,
    without a window over the groups."""
    runs = rollouts.get_column(GROUP).rle().struct.field("len")
    group = rollouts.get_column(GROUP).rle_id()
    rewards = rollouts.get_column(ROLLOUT_REWARD)
    mean, std = grouped_mean_std(rewards, runs)
    extremes = (
        pl.DataFrame({"_group": group, ROLLOUT_REWARD: rewards})
        .group_by("_group", maintain_order=True)
        .agg(pl.col(ROLLOUT_REWARD).min().alias("_min"), pl.col(ROLLOUT_REWARD).max().alias("_max"))
    )
    equal = (extremes.get_column("_min") == extremes.get_column("_max")).gather(group)
    single = (runs == 1).gather(group)
    first = group.is_first_distinct()
    centred = pl.col(ROLLOUT_REWARD) - pl.col("_mean")
    scaled = centred / (pl.col("_std") + pl.lit(EPS, dtype=pl.Float32))
    value = (
        pl.when(pl.col("_equal") | pl.col("_single"))
        .then(pl.lit(0.0, dtype=pl.Float32))
        .when(pl.lit(use_std) & (pl.col("_std") > 0))
        .then(scaled)
        .otherwise(centred)
    )
    return (
        rollouts.with_columns(
            mean.gather(group).alias("_mean"),
            std.gather(group).alias("_std"),
            equal.alias("_equal"),
            single.alias("_single"),
        )
        .with_columns(value.alias(c.REWARDS), (pl.col("_equal") & first).alias("_equal_group"))
        .drop("_equal", "_single")
    )


def _rollouts_are_runs(keys: pl.DataFrame | pl.LazyFrame) -> bool:
    """Whether each rollout's rows are together (one run per group and rollout key) and
    each group's rows are together: then the first row of each run, in order, lists the
    rollouts as `group_normalized` does (the common case: every step miles writes, whose
    leaves of a trajectory follow each other and whose groups do)."""
    rollout = pl.struct(GROUP, c.ROLLOUT_KEY)
    return bool(
        keys.lazy()
        .select(
            (rollout.rle_id().max().fill_null(0) + 1 == rollout.n_unique())
            & (pl.col(GROUP).rle_id().max().fill_null(0) + 1 == pl.col(GROUP).n_unique())
        )
        .collect()
        .item()
    )


def group_normalized(
    light: pl.LazyFrame, groups: pl.Expr, use_std: bool
) -> tuple[pl.LazyFrame, int]:
    """`rewards` per row (float64 of the float32 result), normalized within each group of
    `groups` over its rollouts, and the count of equal-reward groups."""
    grouped = light.with_columns(groups.alias(GROUP))
    # each row's group, rollout key and float32 reward, computed once for both paths
    keys = grouped.select(
        GROUP, c.ROLLOUT_KEY, pl.col(c.REWARD_VALUE).cast(pl.Float32).alias(ROLLOUT_REWARD)
    ).collect()
    if _rollouts_are_runs(keys):
        # each rollout is the first row of its run: no grouping by rollout, no sort and
        # no join back
        run = keys.select(pl.struct(GROUP, c.ROLLOUT_KEY).rle_id()).to_series()
        normalized = normalized_rollout_rewards(keys.filter(run.is_first_distinct()), use_std)
        rewards = normalized.get_column(c.REWARDS).cast(pl.Float64).gather(run)
        equal_groups = int(normalized.get_column("_equal_group").sum())
        return light.with_columns(rewards), equal_groups
    rollouts = (
        keys.lazy()
        .group_by(GROUP, c.ROLLOUT_KEY, maintain_order=True)
        .agg(pl.col(ROLLOUT_REWARD).first())
        # each group's rollouts together, groups in order of first appearance
        .with_row_index("_first")
        .sort(pl.col("_first").min().over(GROUP), maintain_order=True)
        .drop("_first")
        .collect()
        .pipe(normalized_rollout_rewards, use_std=use_std)
    )
    equal_groups = int(rollouts.get_column("_equal_group").sum())
    values = rollouts.lazy().select(GROUP, c.ROLLOUT_KEY, pl.col(c.REWARDS).cast(pl.Float64))
    out = grouped.join(values, on=[GROUP, c.ROLLOUT_KEY], how="left", maintain_order="left")
    return out.drop(GROUP), equal_groups
