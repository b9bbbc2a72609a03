"""Reward normalization per prompt group (SEMANTICS section 5), in float32 as miles."""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.settings import Settings
from pipeline.transforms import samples as s

GROUP = "_group"
ROLLOUT_REWARD = "_r"
EPS = 1e-6


def prompt_groups(light: pl.LazyFrame, n_rows: int, settings: Settings) -> pl.Expr:
    """Group id per row: group_index when every row has one, else fixed fan-out, else one."""
    all_grouped = light.select(pl.col(c.GROUP_INDEX).is_not_null().all()).collect().item()
    if all_grouped:
        return pl.col(c.GROUP_INDEX)
    n, rbs = settings.n_samples_per_prompt, settings.rollout_batch_size
    if n is not None and rbs is not None and n_rows == n * rbs:
        return pl.col(s.POSITION) // n
    return pl.lit(0, dtype=pl.Int64)


def _uses_std(settings: Settings) -> bool:
    return (
        settings.advantage_estimator in ("grpo", "gspo")
        and settings.grpo_std_normalization
        and settings.n_samples_per_prompt != 1
    )


def normalized_rollout_rewards(rollouts: pl.LazyFrame, use_std: bool) -> pl.LazyFrame:
    """One float32 value per (group, rollout key): centred, optionally scaled by the std."""
    r = pl.col(ROLLOUT_REWARD)
    n = pl.len().over(GROUP)
    mean = (r.cast(pl.Float64).sum().over(GROUP) / n).cast(pl.Float32)
    centred = r - mean
    std = (
        (((r.cast(pl.Float64) - mean.cast(pl.Float64)) ** 2).sum().over(GROUP) / (n - 1))
        .sqrt()
        .cast(pl.Float32)
    )
    equal = r.min().over(GROUP) == r.max().over(GROUP)
    scaled = centred / (std + pl.lit(EPS, dtype=pl.Float32))
    value = (
        pl.when(equal | (n == 1))
        .then(pl.lit(0.0, dtype=pl.Float32))
        .when(pl.lit(use_std) & (std > 0))
        .then(scaled)
        .otherwise(centred)
    )
    return rollouts.with_columns(
        value.alias(c.REWARDS),
        (equal & (pl.int_range(pl.len()).over(GROUP) == 0)).alias("_equal_group"),
    )


def with_rewards(light: pl.LazyFrame, n_rows: int, settings: Settings) -> tuple[pl.LazyFrame, int]:
    """`rewards` (float64 of the float32 result) per row, and the count of equal-reward groups."""
    if not settings.normalizes_rewards:
        return light.with_columns(pl.col(s.REWARD_VALUE).alias(c.REWARDS)), 0
    grouped = light.with_columns(prompt_groups(light, n_rows, settings).alias(GROUP))
    rollouts = (
        grouped.group_by(GROUP, s.ROLLOUT_KEY, maintain_order=True)
        .agg(pl.col(s.REWARD_VALUE).first().cast(pl.Float32).alias(ROLLOUT_REWARD))
        .pipe(normalized_rollout_rewards, use_std=_uses_std(settings))
        .collect()
    )
    equal_groups = int(rollouts.get_column("_equal_group").sum())
    values = rollouts.lazy().select(GROUP, s.ROLLOUT_KEY, pl.col(c.REWARDS).cast(pl.Float64))
    out = grouped.join(values, on=[GROUP, s.ROLLOUT_KEY], how="left", maintain_order="left")
    return out.drop(GROUP), equal_groups
