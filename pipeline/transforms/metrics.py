"""A step's rollout metrics under the names miles logs them (CONTRACT 6, docs/metrics.md).

miles' rollout manager logs them over the samples of a rollout step after the trim
(`miles/ray/rollout/metrics.py`, `log_rollout_data`, called on the data
`postprocess_rollout_data` returns); here they are computed over the step's trimmed batch,
in batch order. Ours: `zero_std_ratio`, `rank_tokens/max_over_mean` and `untrained_ratio`.
"""

from __future__ import annotations

import math

import polars as pl

from pipeline import columns as c
from pipeline.manifest import Counts
from pipeline.transforms.weight_versions import version_strings

PREFIX = "rollout/"
RESPONSE_LEN = "rollout/response_len/"
TRUNCATED_RATIO = "rollout/truncated_ratio"
RAW_REWARD = "rollout/raw_reward"
ZERO_STD = "rollout/zero_std/"
ALL_ZERO_PERCENTAGE = "rollout/zero_std/all_zero_percentage"
ALL_ONE_PERCENTAGE = "rollout/zero_std/all_one_percentage"
WEIGHT_VERSION = "rollout/weight_version/"
MIXED_VERSION_RATIO = "rollout/weight_version/mixed_version_ratio"
NUM_TRAINING_SAMPLES = "rollout/num_training_samples"
EPISODE_RAW_REWARD = "rollout/episode_raw_reward"
EPISODE_RESPONSE_LENGTH = "rollout/episode_response_length/"
EPISODE_TOTAL_RESPONSE_LENGTH_MEAN = "rollout/episode_total_response_length/mean"
PASSRATE = "passrate/"
# The x-axis miles logs every rollout metric against (`compute_rollout_step`: the rollout
# id, which is the step).
STEP = "rollout/step"
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
_LAST = "_last_reward"
_SUM = "_reward_sum"
_ZERO_STD = "_zero_std"
_TOKENS = "_rank_tokens"
_REMOVED = "_removed"
_RESPONSE = "_response_length"
_ID = "_rollout_key_id"
_EPISODE_EFFECTIVE = "_episode_effective_length"
_EPISODE_TOTAL = "_episode_total_length"
_EPISODE_REWARD = "_episode_raw_reward"
_SIZE = "_group_size"
_CORRECT = "_num_correct"


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
    if c.LOSS_MASK not in schema and c.MASK_SUM in schema:  # the lists reduced on read
        mask_sum = pl.col(c.MASK_SUM)
    raw = pl.coalesce(pl.col(c.RAW_REWARD), reward) if c.RAW_REWARD in schema else reward
    group = pl.col(c.GROUP_INDEX) if c.GROUP_INDEX in schema else pl.lit(None, dtype=pl.Int64)
    versions = version_strings(schema)
    if versions is not None:
        # Sample.oldest_weight_version: the least of the versions that are digit strings
        # (of every span of every call, `all_weight_version_spans`, in the span form).
        oldest = versions.list.eval(
            pl.element().filter(pl.element().str.contains(r"^[0-9]+$")).cast(pl.Int64)
        ).list.min()
        mixed = versions.list.n_unique().fill_null(0) > 1
        has_versions = versions.list.len().fill_null(0) > 0
    else:
        oldest = pl.lit(None, dtype=pl.Int64)
        mixed = has_versions = pl.lit(False)
    removed = (
        pl.col(c.REMOVE_SAMPLE).fill_null(False) if c.REMOVE_SAMPLE in schema else pl.lit(False)
    )
    # miles' `_get_rollout_key` is (group_index, rollout_id) when the rollout id is set, else
    # (group_index, index), the two kinds kept apart; `index` is never null, and a rollout
    # key (rollout_id, else index) belongs to one trajectory (rollout_key_unique_per_
    # trajectory), so the rollout key and group_index alone tell the same rollouts apart.
    if c.ROLLOUT_ID in schema:
        ident = pl.coalesce(pl.col(c.ROLLOUT_ID), pl.col(c.INDEX))
    else:
        ident = pl.col(c.INDEX)
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
        removed.alias(_REMOVED),
        pl.col(c.RESPONSE_LENGTH).cast(pl.Int64).alias(_RESPONSE),
        ident.cast(pl.Int64).alias(_ID),
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


def _episode_metrics(values: pl.DataFrame) -> dict[str, float]:
    """miles' `_compute_training_sample_metrics` and `_compute_episode_response_length_metrics`
    (PRs #2710, #2765, #2778): rows grouped by rollout key in order of first appearance; per
    rollout the raw rewards' mean (Python's `sum / len`), the effective lengths summed (0 for a
    `remove_sample` row) and the response lengths summed. The input carries no adapter, so
    every row is of one adapter's rollouts (#2778 scopes keys by adapter)."""
    keys = [c.GROUP_INDEX, _ID]
    raw = pl.col(_RAW)
    episodes = values.group_by(keys, maintain_order=True).agg(
        pl.when(pl.col(_REMOVED))
        .then(0)
        .otherwise(pl.col(_EFFECTIVE_LENGTH))
        .sum()
        .alias(_EPISODE_EFFECTIVE),
        pl.col(_RESPONSE).sum().alias(_EPISODE_TOTAL),
        pl.len().alias(_SIZE),
        raw.first().alias(_FIRST),
        raw.last().alias(_LAST),
    )
    # The rollout's rewards summed in order from 0.0, as Python's sum() (a running sum's
    # last value: null where the last reward is, a null before skipped): one or two
    # rewards in one expression; a rollout of more (a multi-leaf trajectory) by a running
    # sum, the only per-group evaluation, on those rows alone.
    first, last, size = pl.col(_FIRST), pl.col(_LAST), pl.col(_SIZE)
    pair = pl.when(last.is_not_null()).then((0.0 + first.fill_null(0.0)) + last)
    total: pl.Expr = pl.when(size == 1).then(0.0 + first).otherwise(pair)
    if episodes.get_column(_SIZE).max() > 2:  # type: ignore[operator]
        longer = values.filter(pl.len().over(keys) > 2)
        running = longer.group_by(keys, maintain_order=True).agg(raw.cum_sum().last().alias(_SUM))
        episodes = episodes.join(
            running, on=keys, how="left", nulls_equal=True, maintain_order="left"
        )
        total = pl.when(size > 2).then(pl.col(_SUM)).otherwise(total)
    episodes = episodes.with_columns((total / size).alias(_EPISODE_REWARD))
    stats = {NUM_TRAINING_SAMPLES: float(values.height)}
    stats |= _statistics(episodes, _EPISODE_EFFECTIVE, EPISODE_RESPONSE_LENGTH)
    scalars = episodes.select(
        pl.col(_EPISODE_TOTAL).mean().alias(EPISODE_TOTAL_RESPONSE_LENGTH_MEAN),
        (pl.col(_EPISODE_REWARD).cum_sum().last() / pl.len()).alias(EPISODE_RAW_REWARD),
    )
    return stats | {name: float(value) for name, value in scalars.row(0, named=True).items()}


def pass_at_k(size: pl.Expr, correct: pl.Expr, k: int) -> pl.Expr:
    """miles' `_estimate_pass_at_k` of one group: 1 - C(n - c, k) / C(n, k), as the product
    of 1 - k / j over j from n - c + 1 to n; 1.0 when fewer than k samples fail."""
    product = (
        pl.int_ranges(size - correct + 1, size + 1)
        .list.eval(1.0 - k / pl.element())
        .list.eval(pl.element().product())
        .list.first()
    )
    return pl.when(size - correct < k).then(1.0).otherwise(1.0 - product)


def _passrate(values: pl.DataFrame, group_size: int | None) -> dict[str, float]:
    """miles' `_compute_passrate_from_samples` (`passrate/pass@k`, k the powers of two up to
    `n_samples_per_prompt`): prompt groups by `group_index` (null being one group) with
    exactly `n_samples_per_prompt` rows, a row correct when its reward is 1; the mean over
    those groups of each group's unbiased pass@k estimate. None when the group size is 1 or
    unset, or when no group is complete."""
    if group_size is None or group_size <= 1:
        return {}
    groups = (
        values.group_by(c.GROUP_INDEX, maintain_order=True)
        .agg(
            pl.len().alias(_SIZE),
            (pl.col(_REWARD) == 1).sum().alias(_CORRECT),
        )
        .filter(pl.col(_SIZE) == group_size)
    )
    if groups.height == 0:
        return {}
    ks = [2**i for i in range(int(math.log2(group_size)) + 1)]
    means = groups.select(
        pass_at_k(pl.col(_SIZE), pl.col(_CORRECT), k).mean().alias(f"{PASSRATE}pass@{k}")
        for k in ks
    )
    return {name: float(value) for name, value in means.row(0, named=True).items()}


def rollout_metrics(
    samples: pl.LazyFrame,
    reward: pl.Expr,
    advantage_estimator: str,
    *,
    n_samples_per_prompt: int | None = None,
    step: int | None = None,
) -> dict[str, float]:
    """miles' rollout metrics of a step's trimmed batch (docs/metrics.md)."""
    forms = [
        n for n in (c.WEIGHT_VERSIONS, c.WEIGHT_VERSION_SPANS) if n in samples.collect_schema()
    ]
    if step is not None and forms:
        from pipeline.transforms.weight_versions import versions_fit_int64

        versions = samples.select(c.INDEX, c.LEAF, *forms).collect()
        versions_fit_int64(versions, step)  # Polars' Int64 would fail on them below
    values = sample_columns(samples, reward).collect()
    if values.height == 0:
        return {}
    stats = _episode_metrics(values)
    stats |= _statistics(values, _EFFECTIVE_LENGTH, RESPONSE_LEN)
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
    stats |= _passrate(values, n_samples_per_prompt)
    if step is not None:
        stats[STEP] = float(step)
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
