"""Derived light columns of a sample table: what validation and planning look at.

Heavy list columns are reduced to lengths and flags here, so that every rule and the
whole plan run on a few scalar columns per row.
"""

from __future__ import annotations

import math

import polars as pl

from pipeline import columns as c
from pipeline.columns import (
    LOG_PROBS_FINITE,
    MASK_BINARY,
    MASK_LEN,
    MASK_SUM,
    METADATA_OBJECT,
    N_TOKENS,
    POSITION,
    REWARD_VALUE,
    RLP_LEN,
    ROLLOUT_KEY,
    SM_SHAPE,
    SMO_LEN,
    TLP_LEN,
    TRAJECTORY,
    TRAJECTORY_SIZE,
)
from pipeline.errors import StepError, Violation
from pipeline.transforms.weight_versions import holds, spans_valid


def reward_value(schema: pl.Schema, reward_key: str | None, step: int) -> pl.Expr:
    """The scalar raw reward (SEMANTICS 5.1): the reward, or its field `reward_key`."""
    dtype = schema[c.REWARD]
    if not isinstance(dtype, pl.Struct):
        return pl.col(c.REWARD).cast(pl.Float64)
    fields = [f.name for f in dtype.fields]
    if reward_key is None or reward_key not in fields:
        what = "is not set" if reward_key is None else f"{reward_key!r} is not a field"
        raise StepError(
            [
                Violation(
                    rule="reward_key",
                    message=f"reward is a struct of {fields} and reward_key {what}: "
                    "set reward_key to the field to train on",
                    step=step,
                )
            ]
        )
    return pl.col(c.REWARD).struct.field(reward_key).cast(pl.Float64)


def _list_len(schema: pl.Schema, name: str) -> pl.Expr:
    if name not in schema:
        return pl.lit(None, dtype=pl.UInt32)
    return pl.col(name).list.len()


def _or_null(schema: pl.Schema, name: str, dtype: pl.DataType) -> pl.Expr:
    return pl.col(name) if name in schema else pl.lit(None, dtype=dtype)


def _log_prob_lists(schema: pl.Schema) -> list[str]:
    return [n for n in (c.ROLLOUT_LOG_PROBS, c.TEACHER_LOG_PROBS) if n in schema]


def _log_probs_finite(schema: pl.Schema) -> pl.Expr:
    """Whether every value of the log-prob lists is finite (null without any list)."""
    names = _log_prob_lists(schema)
    if not names:
        return pl.lit(None, dtype=pl.Boolean)
    finite = [pl.col(n).list.eval(pl.element().is_finite()).list.all() for n in names]
    return pl.all_horizontal(f.fill_null(True) for f in finite)


def log_probs_all_finite(frame: pl.DataFrame) -> bool:
    """Whether `frame` holds log-prob lists and every value in them is finite, judged by
    one sum of all values per column (a NaN or an infinity makes the sum non-finite). False
    also where finite values sum past the float range: the rows are then judged one by one
    (`_log_prob_sums_finite`, then exactly)."""
    names = _log_prob_lists(frame.schema)
    sums = [frame.get_column(n).explode().sum() for n in names]
    return bool(names) and all(math.isfinite(total) for total in sums)


def _log_prob_sums_finite(schema: pl.Schema) -> pl.Expr:
    """A quick `_log_probs_finite`: a list whose sum is finite holds no NaN and no
    infinity, since either would make the sum NaN or infinite. False also where finite
    values sum past the float range; `light_frame` settles those rows exactly."""
    names = _log_prob_lists(schema)
    if not names:
        return pl.lit(None, dtype=pl.Boolean)
    return pl.all_horizontal(pl.col(n).list.sum().is_finite().fill_null(True) for n in names)


def _sampling_mask_shape(schema: pl.Schema) -> pl.Expr:
    """miles' `Sample.validate` of a sampling mask: offsets start at 0, end at the number of
    ids and strictly increase (every token a non-empty support), and ids and offsets are
    both set or both null; null when the step has neither."""
    ids, offsets = c.SAMPLING_MASK_IDS, c.SAMPLING_MASK_OFFSETS
    if ids not in schema and offsets not in schema:
        return pl.lit(None, dtype=pl.Boolean)
    if ids not in schema or offsets not in schema:
        present = ids if ids in schema else offsets
        return pl.when(pl.col(present).is_not_null()).then(pl.lit(False))
    starts = pl.col(offsets).list.first() == 0
    ends = pl.col(offsets).list.last() == pl.col(ids).list.len()
    rising = pl.col(offsets).list.diff(null_behavior="drop").list.min().fill_null(1) > 0
    both = pl.col(ids).is_not_null() & pl.col(offsets).is_not_null()
    neither = pl.col(ids).is_null() & pl.col(offsets).is_null()
    return (
        pl.when(neither)
        .then(pl.lit(None, dtype=pl.Boolean))
        .when(both)
        .then((starts & ends & rising).fill_null(False))
        .otherwise(pl.lit(False))
    )


def list_reductions(schema: pl.Schema) -> dict[str, pl.Expr]:
    """What the rules and the plan need of the list columns, one scalar per row each; the
    log probs' finiteness is the quick one (`light_frame` and `reduced_lists` settle it)."""
    mask_sum = pl.col(c.LOSS_MASK).list.sum() if c.LOSS_MASK in schema else pl.lit(None)
    # Values in {0, 1}, nulls aside: the least at least 0 and the greatest at most 1 (a
    # tenth of the time of testing each value; an empty or all-null list is binary).
    mask = pl.col(c.LOSS_MASK)
    mask_binary = (
        pl.when(mask.is_not_null()).then(
            ((mask.list.min() >= 0) & (mask.list.max() <= 1)).fill_null(True)
        )
        if c.LOSS_MASK in schema
        else pl.lit(None, dtype=pl.Boolean)
    )
    reductions = {
        N_TOKENS: pl.col(c.TOKENS).list.len().cast(pl.Int64),
        MASK_LEN: _list_len(schema, c.LOSS_MASK).cast(pl.Int64),
        MASK_BINARY: mask_binary,
        MASK_SUM: mask_sum.cast(pl.Int64),
        RLP_LEN: _list_len(schema, c.ROLLOUT_LOG_PROBS).cast(pl.Int64),
        TLP_LEN: _list_len(schema, c.TEACHER_LOG_PROBS).cast(pl.Int64),
        SMO_LEN: _list_len(schema, c.SAMPLING_MASK_OFFSETS).cast(pl.Int64),
        SM_SHAPE: _sampling_mask_shape(schema),
        c.SPANS_VALID: spans_valid(schema),
        c.HAS_VERSION_STRINGS: holds(schema, c.WEIGHT_VERSIONS),
        c.HAS_VERSION_SPANS: holds(schema, c.WEIGHT_VERSION_SPANS),
        LOG_PROBS_FINITE: _log_prob_sums_finite(schema),
    }
    for name in c.PER_TOKEN_COLUMNS:
        if name in c.ALL_OR_NONE:
            reductions[c.has_column(name)] = (
                pl.col(name).is_not_null() if name in schema else pl.lit(False)
            )
    return reductions


def reduced_lists(frame: pl.DataFrame) -> pl.DataFrame:
    """The list columns of `frame` (`c.PER_TOKEN_COLUMNS`) reduced, exactly, to what the rules,
    the plan and the metrics need of them, with a `has_column` flag for each: a frame
    without its lists carries these in their place (the rank-bounded build holds the
    lists of one part of a step at a time)."""
    flags = {
        c.has_column(name): pl.col(name).is_not_null() if name in frame.columns else pl.lit(False)
        for name in c.PER_TOKEN_COLUMNS
    }
    reductions = list_reductions(frame.schema) | flags
    if log_probs_all_finite(frame):
        reductions[LOG_PROBS_FINITE] = pl.lit(True)
    reduced = frame.select(expr.alias(name) for name, expr in reductions.items())
    quick = reduced.get_column(LOG_PROBS_FINITE)
    suspects = quick.not_().fill_null(False).arg_true()
    if suspects.len():
        exact = frame[suspects].select(_log_probs_finite(frame.schema)).to_series()
        reduced = reduced.with_columns(quick.scatter(suspects, exact))
    return reduced


def light_columns(
    lf: pl.LazyFrame, reward_key: str | None, step: int, finite: bool = False
) -> pl.LazyFrame:
    """The per-row scalars every rule and the plan need, without any list column; its
    LOG_PROBS_FINITE is the quick one (`light_frame` gives the exact frame), or true on
    every row where the caller knows every log prob `finite` (`log_probs_all_finite`). A
    frame whose lists were reduced (`reduced_lists`) gives the same columns from the
    reductions."""
    schema = lf.collect_schema()
    # reduced lists win over lists in place: a step read in parts or shares
    # (`step.readers`) keeps each list's shape (null or not), its values kept elsewhere
    reduced = N_TOKENS in schema
    reductions = {
        name: pl.col(name) if reduced else expr for name, expr in list_reductions(schema).items()
    }
    if finite and not reduced:
        reductions[LOG_PROBS_FINITE] = pl.lit(True)
    # A text that starts with "{" and parses (json_path_match gives null when it does
    # not) is a JSON object; a null train_metadata is the all-or-none rule's to judge.
    metadata = pl.col(c.TRAIN_METADATA)
    metadata_object = (
        pl.when(metadata.is_not_null()).then(
            metadata.str.strip_chars().str.starts_with("{")
            & metadata.str.json_path_match("$").is_not_null()
        )
        if c.TRAIN_METADATA in schema
        else pl.lit(None, dtype=pl.Boolean)
    )
    key = pl.coalesce(_or_null(schema, c.ROLLOUT_ID, pl.Int64()), pl.col(c.INDEX))
    # slime names each sample's source from its metadata; a substring test first keeps the
    # JSON parse off the rows (and steps) that have none
    meta = pl.col(c.METADATA)
    source_name = (
        pl.when(meta.str.contains("source_name", literal=True))
        .then(meta.str.json_path_match("$.source_name"))
        .otherwise(pl.lit(None, dtype=pl.String))
        if c.METADATA in schema and schema[c.METADATA] == pl.String
        else pl.lit(None, dtype=pl.String)
    )
    return lf.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias(POSITION),
        pl.col(c.STEP),
        pl.col(c.INDEX),
        pl.col(c.LEAF),
        _or_null(schema, c.GROUP_INDEX, pl.Int64()).alias(c.GROUP_INDEX),
        _or_null(schema, c.ROLLOUT_ID, pl.Int64()).alias(c.ROLLOUT_ID),
        _or_null(schema, c.SESSION_VERSION, pl.String()).alias(c.SESSION_VERSION),
        pl.col(c.STATUS),
        pl.col(c.RESPONSE_LENGTH),
        pl.col(c.REMOVE_SAMPLE),
        *(reductions[name].alias(name) for name in LIST_REDUCTIONS),
        metadata_object.alias(METADATA_OBJECT),
        reductions[LOG_PROBS_FINITE].alias(LOG_PROBS_FINITE),
        *(
            (
                reductions[c.has_column(name)]
                if c.has_column(name) in reductions
                else pl.col(name).is_not_null()
                if name in schema
                else pl.lit(False)
            ).alias(c.has_column(name))
            for name in c.ALL_OR_NONE
        ),
        reward_value(schema, reward_key, step).alias(REWARD_VALUE),
        _or_null(schema, c.RAW_REWARD, pl.Float64()).alias(c.RAW_REWARD),
        pl.len().over(TRAJECTORY).cast(pl.Int64).alias(TRAJECTORY_SIZE),
        key.alias(ROLLOUT_KEY),
        source_name.alias(c.SOURCE_NAME),
        pl.col(c.SOURCE_FILE),
        _or_null(schema, c.SOURCE_ROW, pl.Int64()).alias(c.SOURCE_ROW),  # for error lines
        _or_null(schema, "_path_step", pl.Int64()).alias("_path_step"),
    )


LIST_REDUCTIONS = (
    *(N_TOKENS, MASK_LEN, MASK_BINARY, MASK_SUM, RLP_LEN, TLP_LEN, SMO_LEN, SM_SHAPE),
    *(c.SPANS_VALID, c.HAS_VERSION_STRINGS, c.HAS_VERSION_SPANS),
)


def light_frame(frame: pl.DataFrame, reward_key: str | None, step: int) -> pl.DataFrame:
    """The light columns of `frame`, one row per row of it. Finiteness of the log probs is
    first judged by sums (a sum is finite only if every value is, and summing is cheaper
    than `is_finite` on each value): of all values at once, then of each row's, then value
    by value on the rows whose sum is not finite."""
    if N_TOKENS in frame.columns:  # reduced lists: LOG_PROBS_FINITE is exact already
        return light_columns(frame.lazy(), reward_key, step).collect()
    finite = log_probs_all_finite(frame)
    light = light_columns(frame.lazy(), reward_key, step, finite).collect()
    if finite:
        return light
    quick = light.get_column(LOG_PROBS_FINITE)
    suspects = quick.not_().fill_null(False).arg_true()
    if suspects.len() == 0:
        return light
    exact = frame[suspects].select(_log_probs_finite(frame.schema)).to_series()
    return light.with_columns(quick.scatter(suspects, exact))
