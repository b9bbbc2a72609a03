"""Pandera models of a rollout sample table (CONTRACT section 1, SEMANTICS sections 2-5).

`RolloutSampleTable` checks types and nullability of the full table. The rules that look
across rows run on the light per-row frame of `transforms.samples.light_columns`, so
failure cases never carry token lists.
"""

from __future__ import annotations

from typing import Optional

import pandera.polars as pa
import polars as pl
from pandera.api.polars.types import PolarsData

from pipeline import columns as c

V2_MULTI_LEAF = (pl.col(c.SESSION_VERSION) == "v2").fill_null(False) & (
    pl.col(c.TRAJECTORY_SIZE) > 1
)


class RolloutSampleTable(pa.DataFrameModel):
    """Types and nullability of every contract column."""

    step: pl.Int64 = pa.Field(nullable=False)
    group_index: Optional[pl.Int64] = pa.Field(nullable=True)  # noqa: UP045 - pandera reads Optional
    index: pl.Int64 = pa.Field(nullable=False)
    leaf: pl.Int32 = pa.Field(nullable=False, ge=0)
    rollout_id: Optional[pl.Int64] = pa.Field(nullable=True)  # noqa: UP045
    session_version: Optional[pl.String] = pa.Field(nullable=True, isin=list(c.SESSION_VERSIONS))  # noqa: UP045
    status: pl.String = pa.Field(nullable=False, isin=list(c.STATUSES))
    tokens: pl.List(pl.Int32) = pa.Field(nullable=False)  # type: ignore[valid-type]
    response_length: pl.Int32 = pa.Field(nullable=False, ge=0)
    loss_mask: Optional[pl.List(pl.Int8)] = pa.Field(nullable=True)  # type: ignore[valid-type]  # noqa: UP045
    remove_sample: pl.Boolean = pa.Field(nullable=False)
    rollout_log_probs: Optional[pl.List(pl.Float32)] = pa.Field(nullable=True)  # type: ignore[valid-type]  # noqa: UP045
    teacher_log_probs: Optional[pl.List(pl.Float32)] = pa.Field(nullable=True)  # type: ignore[valid-type]  # noqa: UP045
    weight_versions: Optional[pl.List(pl.String)] = pa.Field(nullable=True)  # type: ignore[valid-type]  # noqa: UP045
    raw_reward: Optional[pl.Float64] = pa.Field(nullable=True)  # noqa: UP045
    round_number: Optional[pl.Int64] = pa.Field(nullable=True)  # noqa: UP045
    train_metadata: Optional[pl.String] = pa.Field(nullable=True)  # noqa: UP045

    class Config:
        strict = False


def _ok(data: PolarsData, expr: pl.Expr) -> pl.LazyFrame:
    return data.lazyframe.select(expr.fill_null(True).alias("ok"))


def _all_or_none(name: str) -> pl.Expr:
    """The rows on the minority side are the odd ones out: rows without the column,
    unless fewer than half the rows have it (then those few rows are flagged)."""
    has = pl.col(f"_has_{name}")
    mostly_set = has.sum() * 2 >= pl.len()
    return pl.when(mostly_set).then(has).otherwise(~has)


class SampleRules(pa.DataFrameModel):
    """Row invariants and the rollout-id rule, on the light per-row frame."""

    class Config:
        strict = False

    @pa.dataframe_check(
        error="step_matches_path: step column disagrees with the step in the file path"
    )
    def step_matches_path(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.STEP) == pl.col("_path_step"))

    @pa.dataframe_check(
        error="response_within_tokens: response_length must be within 0..len(tokens)"
    )
    def response_within_tokens(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.RESPONSE_LENGTH) <= pl.col(c.N_TOKENS))

    @pa.dataframe_check(error="loss_mask_length: loss_mask length must equal response_length")
    def loss_mask_length(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.MASK_LEN) == pl.col(c.RESPONSE_LENGTH))

    @pa.dataframe_check(error="loss_mask_binary: loss_mask values must be 0 or 1")
    def loss_mask_binary(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.MASK_BINARY))

    @pa.dataframe_check(
        error="rollout_log_probs_length: rollout_log_probs length must equal response_length"
    )
    def rollout_log_probs_length(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.RLP_LEN) == pl.col(c.RESPONSE_LENGTH))

    @pa.dataframe_check(
        error="teacher_log_probs_length: teacher_log_probs length must equal response_length"
    )
    def teacher_log_probs_length(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.TLP_LEN) == pl.col(c.RESPONSE_LENGTH))

    @pa.dataframe_check(
        error="train_metadata_json_object: train_metadata must be a JSON object ({...})"
    )
    def train_metadata_json_object(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.METADATA_OBJECT))

    @pa.dataframe_check(
        error="multi_leaf_only_in_v2: several rows share this index without session_version "
        "v2: only session v2 writes multi-leaf trajectories, so these are duplicated rows"
    )
    def multi_leaf_only_in_v2(cls, data: PolarsData) -> pl.LazyFrame:
        # Rows repeating a (step, index, leaf) are unique_leaf's to report, and a
        # trajectory mixing session versions is one_session_version's.
        single = pl.col(c.TRAJECTORY_SIZE) == 1
        v2 = (pl.col(c.SESSION_VERSION) == "v2").fill_null(False)
        mixed = pl.col(c.SESSION_VERSION).fill_null("").n_unique().over(c.TRAJECTORY) > 1
        repeated_leaf = (pl.len().over(c.STEP, c.INDEX, c.LEAF) > 1).any().over(c.TRAJECTORY)
        return _ok(data, single | v2 | mixed | repeated_leaf)

    @pa.dataframe_check(error="unique_leaf: (step, index, leaf) must be unique")
    def unique_leaf(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.len().over(c.STEP, c.INDEX, c.LEAF) == 1)

    @pa.dataframe_check(
        error="one_session_version: all leaves of a trajectory must have one session_version"
    )
    def one_session_version(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.SESSION_VERSION).fill_null("").n_unique().over(c.TRAJECTORY) == 1)

    @pa.dataframe_check(
        error="rollout_id_only_on_v2_multi_leaf: "
        "rollout_id must be set exactly on the leaves of v2 multi-leaf trajectories; "
        "v1 rows and v2 singletons keep it null (miles PR #2536)"
    )
    def rollout_id_only_on_v2_multi_leaf(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.ROLLOUT_ID).is_not_null() == V2_MULTI_LEAF)

    @pa.dataframe_check(
        error="rollout_id_shared_by_siblings: "
        "all leaves of a v2 multi-leaf trajectory must share one rollout_id"
    )
    def rollout_id_shared_by_siblings(cls, data: PolarsData) -> pl.LazyFrame:
        # A leaf without an id is rollout_id_only_on_v2_multi_leaf's to report.
        return _ok(data, pl.col(c.ROLLOUT_ID).drop_nulls().n_unique().over(c.TRAJECTORY) <= 1)

    @pa.dataframe_check(
        error="rollout_key_unique_per_trajectory: "
        "a rollout key (rollout_id, else index) must belong to exactly one trajectory "
        "of the step; two trajectories share it"
    )
    def rollout_key_unique_per_trajectory(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.INDEX).n_unique().over(c.STEP, c.ROLLOUT_KEY) == 1)

    @pa.dataframe_check(error="reward_finite: reward must be a finite number on every row")
    def reward_finite(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col(c.REWARD_VALUE).is_finite().fill_null(False))

    @pa.dataframe_check(
        error="raw_reward_finite: raw_reward must be a finite number or null on every row"
    )
    def raw_reward_finite(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.RAW_REWARD).is_finite())

    @pa.dataframe_check(
        error="log_probs_finite: rollout_log_probs and teacher_log_probs must hold finite "
        "numbers only (no NaN or infinity)"
    )
    def log_probs_finite(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, pl.col(c.LOG_PROBS_FINITE))

    @pa.dataframe_check(
        error="rollout_log_probs_all_or_none: "
        "rollout_log_probs is null on some rows and set on others"
    )
    def rollout_log_probs_all_or_none(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, _all_or_none(c.ROLLOUT_LOG_PROBS))

    @pa.dataframe_check(
        error="teacher_log_probs_all_or_none: "
        "teacher_log_probs is null on some rows and set on others"
    )
    def teacher_log_probs_all_or_none(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, _all_or_none(c.TEACHER_LOG_PROBS))

    @pa.dataframe_check(
        error="round_number_all_or_none: round_number is null on some rows and set on others"
    )
    def round_number_all_or_none(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, _all_or_none(c.ROUND_NUMBER))

    @pa.dataframe_check(
        error="train_metadata_all_or_none: train_metadata is null on some rows and set on others"
    )
    def train_metadata_all_or_none(cls, data: PolarsData) -> pl.LazyFrame:
        return _ok(data, _all_or_none(c.TRAIN_METADATA))


class SiblingRewards(pa.DataFrameModel):
    """Rows of one rollout share one raw reward (SEMANTICS 5.3 step 3), when normalizing."""

    class Config:
        strict = False

    @pa.dataframe_check(
        error="rollout_shares_reward: all samples of a rollout must share one reward"
    )
    def rollout_shares_reward(cls, data: PolarsData) -> pl.LazyFrame:
        reward = pl.col(c.REWARD_VALUE)
        # NaN never equals itself, so NaN siblings disagree; a lone row always agrees.
        same = (pl.len() == 1) | ((reward.max() == reward.min()) & ~reward.is_nan().any())
        # A key shared by two trajectories is rollout_key_unique_per_trajectory's to report.
        shared_key = pl.col(c.INDEX).n_unique() > 1
        return _ok(data, (same | shared_key).over(c.STEP, c.ROLLOUT_KEY))
