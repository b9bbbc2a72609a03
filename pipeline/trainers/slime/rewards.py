"""slime's reward normalization (`_post_process_rewards`), blind to `group_index` and
rollout ids: rows in runs of n_samples_per_prompt when the batch is n_samples_per_prompt *
rollout_batch_size rows, else the whole batch as one group; in float32, the mean as torch's
sum over n, the std (grpo, gspo, cispo) as torch's one-dimension std, always divided by
std + 1e-6 (a group of equal rewards gets its rounding noise scaled, not zeros)."""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.trainers import Settings
from pipeline.transforms.reward_groups import RewardGroups
from pipeline.transforms.torch_float import torch_dim_std, torch_sums

EPS = 1e-6
# slime's estimators that normalize, and those that divide by the std
NORMALIZING = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD = ("grpo", "gspo", "cispo")


def reward_groups(settings: Settings, ingested: int) -> RewardGroups:
    """slime's positional groups as the step was ingested: runs of n_samples_per_prompt
    rows when the batch is rollout_batch_size x n_samples_per_prompt rows, else one group
    of the whole batch (`group_index` plays no part)."""
    if not (settings.advantage_estimator in NORMALIZING and settings.rewards_normalization):
        return RewardGroups("none", "rewards not normalized")
    n = settings.n_samples_per_prompt or 1
    rbs = settings.rollout_batch_size or 0
    if ingested == n * rbs:
        return RewardGroups(
            "positional",
            f"runs of n_samples_per_prompt={n} rows of a batch of rollout_batch_size x "
            f"n_samples_per_prompt = {ingested} rows",
            width=n,
        )
    return RewardGroups(
        "whole",
        f"a batch of {ingested} rows that is not rollout_batch_size x n_samples_per_prompt "
        "rows, which slime normalizes by position",
    )


def positional_rewards(
    raw: pl.Series, settings: Settings, given: RewardGroups | None = None
) -> tuple[pl.Series, int]:
    """`rewards` (float64 of the float32 result) and the count of positional groups whose
    raw rewards are all equal (their normalized values are rounding noise over 1e-6).
    `given`: the groups as the step was ingested (quarantine sets positional groups aside
    whole, so the rows left are still runs of n_samples_per_prompt); None: decided on these
    rows."""
    if given is None:
        given = reward_groups(settings, len(raw))
    if given.kind == "none" or not len(raw):
        return raw, 0
    n = settings.n_samples_per_prompt or 1
    width = given.width if given.kind == "positional" else len(raw)
    groups = len(raw) // width
    group = pl.int_range(len(raw), dtype=pl.Int64, eager=True) // width
    x = raw.cast(pl.Float32)
    # a division by a Series: Polars divides by a scalar as a product with its reciprocal
    mean = torch_sums(x, width) / pl.repeat(width, groups, dtype=pl.Float32, eager=True)
    centred = x - mean.gather(group)
    std_on = settings.advantage_estimator in STD and settings.grpo_std_normalization and n != 1
    if std_on:
        std = torch_dim_std(centred, width)
        denominator = std + pl.repeat(EPS, groups, dtype=pl.Float32, eager=True)
        centred = centred / denominator.gather(group)
    equal = (
        pl.DataFrame({"g": group, "r": raw})
        .group_by("g")
        .agg((pl.col("r").min() == pl.col("r").max()).alias("same"))
    )
    return centred.cast(pl.Float64).alias(c.REWARDS), int(equal.get_column("same").sum())
