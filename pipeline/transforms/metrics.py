"""A step's rollout metrics under the names miles logs them (CONTRACT 7, docs/metrics.md).

miles' rollout manager logs them over the samples of a rollout step before the trim
(`miles/ray/rollout/metrics.py`, `_compute_metrics_from_samples`); here they are computed
over the step's valid ingested rows, in batch order. Ours: `zero_std_ratio`,
`rank_tokens/max_over_mean` and `untrained_ratio`.
"""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.manifest import Counts

PREFIX = "rollout/"
RESPONSE_LEN = "rollout/response_len/"
TRUNCATED_RATIO = "rollout/truncated_ratio"
RAW_REWARD = "rollout/raw_reward"
ZERO_STD = "rollout/zero_std/"
ALL_ZERO_PERCENTAGE = "rollout/zero_std/all_zero_percentage"
ALL_ONE_PERCENTAGE = "rollout/zero_std/all_one_percentage"
WEIGHT_VERSION = "rollout/weight_version/"
MIXED_VERSION_RATIO = "rollout/weight_version/mixed_version_ratio"
ZERO_STD_RATIO = "zero_std_ratio"
RANK_TOKENS_MAX_OVER_MEAN = "rank_tokens/max_over_mean"
UNTRAINED_RATIO = "untrained_ratio"

# Internal columns of this module.
_EFFECTIVE_LENGTH = "_effective_length"
_TRUNCATED = "_is_truncated"
_REWARD = "_metric_reward"
_RAW = "_metric_raw_reward"
_OLDEST = "_oldest_weight_version"
_MIXED = "_mixed_versions"
_HAS_VERSIONS = "_has_weight_versions"
_FIRST = "_first_reward"
_ZERO_STD = "_zero_std"
_TOKENS = "_rank_tokens"


def _statistics(frame: pl.DataFrame, column: str, prefix: str) -> dict[str, float]:
    """miles' `compute_statistics`: numpy mean, median, max and min of the values."""
    values = frame.select(
        pl.col(column).mean().alias("mean"),
        pl.col(column).median().alias("median"),
        pl.col(column).max().cast(pl.Float64).alias("max"),
        pl.col(column).min().cast(pl.Float64).alias("min"),
    )
    return {prefix + name: float(value) for name, value in values.row(0, named=True).items()}


def sample_columns(samples: pl.LazyFrame, reward: pl.Expr) -> pl.LazyFrame:
    """The per-sample values the metrics read. `reward` is the scalar reward (SEMANTICS 5.1,
    miles' `get_reward_value`); the raw reward is the `raw_reward` column where set."""
    schema = samples.collect_schema()
    mask_sum = pl.col(c.LOSS_MASK).list.sum() if c.LOSS_MASK in schema else pl.lit(None)
    raw = pl.coalesce(pl.col(c.RAW_REWARD), reward) if c.RAW_REWARD in schema else reward
    group = pl.col(c.GROUP_INDEX) if c.GROUP_INDEX in schema else pl.lit(None, dtype=pl.Int64)
    if c.WEIGHT_VERSIONS in schema:
        versions = pl.col(c.WEIGHT_VERSIONS)
        # Sample.oldest_weight_version: the least of the versions that are digit strings.
        oldest = versions.list.eval(
            pl.element().filter(pl.element().str.contains(r"^[0-9]+$")).cast(pl.Int64)
        ).list.min()
        mixed = versions.list.n_unique().fill_null(0) > 1
        has_versions = versions.list.len().fill_null(0) > 0
    else:
        oldest = pl.lit(None, dtype=pl.Int64)
        mixed = has_versions = pl.lit(False)
    return samples.select(
        pl.coalesce(mask_sum.cast(pl.Int64), pl.col(c.RESPONSE_LENGTH).cast(pl.Int64)).alias(
            _EFFECTIVE_LENGTH
        ),
        (pl.col(c.STATUS) == "truncated").alias(_TRUNCATED),
        group.alias(c.GROUP_INDEX),
        reward.alias(_REWARD),
        raw.alias(_RAW),
        oldest.alias(_OLDEST),
        mixed.alias(_MIXED),
        has_versions.alias(_HAS_VERSIONS),
    )


def _zero_std(values: pl.DataFrame) -> dict[str, float]:
    """miles' `_compute_zero_std_metrics`: prompt groups (by `group_index`, null being one
    group) whose rewards all equal the first, counted by the first reward rounded to one
    decimal; and the shares of all-0 and all-1 groups among all groups."""
    groups = values.group_by(c.GROUP_INDEX, maintain_order=True).agg(
        pl.col(_REWARD).first().alias(_FIRST),
        (pl.col(_REWARD) == pl.col(_REWARD).first()).all().alias(_ZERO_STD),
    )
    by_reward = groups.filter(pl.col(_ZERO_STD)).group_by(_FIRST, maintain_order=True).agg(pl.len())
    # One entry per distinct reward of a zero-std group (a handful): the key is Python's
    # str(round(r, 1)), as miles names it, and two rewards can round to one key.
    counts: dict[str, int] = {}
    rewards = by_reward.get_column(_FIRST).to_list()
    for reward, count in zip(rewards, by_reward.get_column("len").to_list(), strict=True):
        key = str(round(reward, 1))
        counts[key] = counts.get(key, 0) + count
    total = groups.height
    stats = {f"{ZERO_STD}count_{key}": float(count) for key, count in counts.items()}
    stats[ALL_ZERO_PERCENTAGE] = counts.get("0.0", 0) / total
    stats[ALL_ONE_PERCENTAGE] = counts.get("1.0", 0) / total
    stats[ZERO_STD_RATIO] = sum(counts.values()) / total
    return stats


def rollout_metrics(
    samples: pl.LazyFrame, reward: pl.Expr, advantage_estimator: str
) -> dict[str, float]:
    """miles' rollout metrics of a step's valid rows (docs/metrics.md)."""
    values = sample_columns(samples, reward).collect()
    if values.height == 0:
        return {}
    stats = _statistics(values, _EFFECTIVE_LENGTH, RESPONSE_LEN)
    if advantage_estimator != "ppo":  # miles: only for GRPO-like estimators
        stats |= _zero_std(values)
    scalars = values.select(
        pl.col(_TRUNCATED).mean().alias(TRUNCATED_RATIO),
        # miles' trainer logs Python's sum(raw_reward) / len: a sequential sum
        (pl.col(_RAW).cum_sum().last() / pl.len()).alias(RAW_REWARD),
    )
    stats |= {name: float(value) for name, value in scalars.row(0, named=True).items()}
    oldest = values.filter(pl.col(_OLDEST).is_not_null())
    if oldest.height:
        stats |= _statistics(oldest, _OLDEST, WEIGHT_VERSION)
    # miles logs the ratio only beside numeric versions; ours: whenever a row has versions
    # ("w3" style versions mix as well as numbers do).
    if values.get_column(_HAS_VERSIONS).any():
        stats[MIXED_VERSION_RATIO] = float(values.get_column(_MIXED).sum()) / values.height
    return stats


def layout_metrics(ranks: pl.LazyFrame, dp_size: int, counts: Counts) -> dict[str, float]:
    """Ours: the token imbalance across ranks (largest rank's tokens over the mean, ranks
    without rows counting 0) and the share of written rows the trainer never trains."""
    tokens = (
        pl.LazyFrame({c.RANK: pl.int_range(dp_size, dtype=pl.Int32, eager=True)})
        .join(
            ranks.group_by(c.RANK).agg(pl.col(c.TOTAL_LENGTHS).cast(pl.Int64).sum().alias(_TOKENS)),
            on=c.RANK,
            how="left",
        )
        .select(pl.col(_TOKENS).fill_null(0).max() / pl.col(_TOKENS).fill_null(0).mean())
        .collect()
        .item()
    )
    stats = {UNTRAINED_RATIO: counts.untrained / counts.written if counts.written else 0.0}
    if tokens is not None and tokens == tokens:  # NaN when no rank holds a token
        stats[RANK_TOKENS_MAX_OVER_MEAN] = float(tokens)
    return stats
