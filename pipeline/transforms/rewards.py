"""Reward normalization per prompt group (SEMANTICS section 5), in float32 as miles."""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.columns import GROUP, ROLLOUT_REWARD
from pipeline.settings import Settings
from pipeline.transforms.torch_float import grouped_mean_std

EPS = 1e-6


def prompt_groups(light: pl.LazyFrame, n_rows: int, settings: Settings) -> pl.Expr:
    """Group id per row: group_index when every row has one, else fixed fan-out, else one."""
    all_grouped = light.select(pl.col(c.GROUP_INDEX).is_not_null().all()).collect().item()
    if all_grouped:
        return pl.col(c.GROUP_INDEX)
    n, rbs = settings.n_samples_per_prompt, settings.rollout_batch_size
    if n is not None and rbs is not None and n_rows == n * rbs:
        return pl.col(c.POSITION) // n
    return pl.lit(0, dtype=pl.Int64)


def _uses_std(settings: Settings) -> bool:
    return (
        settings.advantage_estimator in ("grpo", "gspo")
        and settings.grpo_std_normalization
        and settings.n_samples_per_prompt != 1
    )


def normalized_rollout_rewards(rollouts: pl.DataFrame, use_std: bool) -> pl.DataFrame:
    """One float32 value per (group, rollout key): centred, optionally scaled by the std.

    `rollouts` lists each group's rollouts together, in order of first appearance; the
    group means and stds are torch's bits (transforms.torch_float)."""
    sizes = rollouts.group_by(GROUP, maintain_order=True).len().get_column("len")
    mean, std = grouped_mean_std(rollouts.get_column(ROLLOUT_REWARD), sizes)
    group = rollouts.select(pl.col(GROUP).rle_id()).to_series()
    r = pl.col(ROLLOUT_REWARD)
    n = pl.len().over(GROUP)
    centred = r - pl.col("_mean")
    scaled = centred / (pl.col("_std") + pl.lit(EPS, dtype=pl.Float32))
    equal = r.min().over(GROUP) == r.max().over(GROUP)
    value = (
        pl.when(equal | (n == 1))
        .then(pl.lit(0.0, dtype=pl.Float32))
        .when(pl.lit(use_std) & (pl.col("_std") > 0))
        .then(scaled)
        .otherwise(centred)
    )
    return rollouts.with_columns(
        mean.gather(group).alias("_mean"),
        std.gather(group).alias("_std"),
    ).with_columns(
        value.alias(c.REWARDS),
        (equal & (pl.int_range(pl.len()).over(GROUP) == 0)).alias("_equal_group"),
    )


def with_rewards(light: pl.LazyFrame, n_rows: int, settings: Settings) -> tuple[pl.LazyFrame, int]:
    """`rewards` (float64 of the float32 result) per row, and the count of equal-reward groups."""
    if not settings.normalizes_rewards:
        return light.with_columns(pl.col(c.REWARD_VALUE).alias(c.REWARDS)), 0
    grouped = light.with_columns(prompt_groups(light, n_rows, settings).alias(GROUP))
    rollouts = (
        grouped.group_by(GROUP, c.ROLLOUT_KEY, maintain_order=True)
        .agg(pl.col(c.REWARD_VALUE).first().cast(pl.Float32).alias(ROLLOUT_REWARD))
        # each group's rollouts together, groups in order of first appearance
        .with_row_index("_first")
        .sort(pl.col("_first").min().over(GROUP), maintain_order=True)
        .drop("_first")
        .collect()
        .pipe(normalized_rollout_rewards, use_std=_uses_std(settings))
    )
    equal_groups = int(rollouts.get_column("_equal_group").sum())
    values = rollouts.lazy().select(GROUP, c.ROLLOUT_KEY, pl.col(c.REWARDS).cast(pl.Float64))
    out = grouped.join(values, on=[GROUP, c.ROLLOUT_KEY], how="left", maintain_order="left")
    return out.drop(GROUP), equal_groups
