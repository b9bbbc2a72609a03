"""Per-row shard columns of the trimmed batch (SEMANTICS section 4)."""

from __future__ import annotations

import polars as pl

from pipeline import columns as c

EFFECTIVE_MASK_SUM = "_effective_mask_sum"


def light_shard_columns(light: pl.LazyFrame) -> pl.LazyFrame:
    """The scalar shard columns, computed on the light frame of the trimmed batch."""
    mask_sum = (
        pl.when(pl.col(c.REMOVE_SAMPLE))
        .then(0)
        .otherwise(pl.coalesce(pl.col(c.MASK_SUM), pl.col(c.RESPONSE_LENGTH).cast(pl.Int64)))
    )
    return light.with_columns(
        pl.col(c.POSITION).alias(c.BATCH_POSITION),
        pl.col(c.RESPONSE_LENGTH).alias(c.RESPONSE_LENGTHS),
        pl.col(c.N_TOKENS).cast(pl.Int32).alias(c.TOTAL_LENGTHS),
        (pl.col(c.STATUS) == "truncated").cast(pl.Int8).alias(c.TRUNCATED),
        pl.col(c.INDEX).alias(c.SAMPLE_INDICES),
        pl.col(c.ROLLOUT_KEY).alias(c.ROLLOUT_IDS),
        mask_sum.sum().over(c.ROLLOUT_KEY).cast(pl.Int64).alias(c.ROLLOUT_MASK_SUMS),
    )


def _filled(value: int) -> pl.Expr:
    """A list of response_length `value`s per row: the response part of the row's tokens
    (validation holds response_length within len(tokens)) with every element replaced:
    the lists keep the layout of the tokens' tails instead of being built one by one with
    `repeat_by`."""
    response = pl.col(c.TOKENS).list.tail(pl.col(c.RESPONSE_LENGTH))
    return response.list.eval(pl.lit(value, dtype=pl.Int8))


def loss_masks(frame: pl.DataFrame) -> pl.Expr:
    """Null becomes response_length ones; remove_sample zeroes the mask. Where no row of
    `frame` needs either, the masks are the loss_mask column itself: the filled lists are
    built for every row before `when` picks."""
    if c.LOSS_MASK not in frame.columns:
        masks = pl.when(pl.col(c.REMOVE_SAMPLE)).then(_filled(0)).otherwise(_filled(1))
        return masks.alias(c.LOSS_MASKS)
    removed = frame.get_column(c.REMOVE_SAMPLE).any()
    if not removed and not frame.get_column(c.LOSS_MASK).has_nulls():
        return pl.col(c.LOSS_MASK).alias(c.LOSS_MASKS)
    return (
        pl.when(pl.col(c.REMOVE_SAMPLE))
        .then(_filled(0))
        .when(pl.col(c.LOSS_MASK).is_null())
        .then(_filled(1))
        .otherwise(pl.col(c.LOSS_MASK))
        .alias(c.LOSS_MASKS)
    )


def raw_reward(schema: pl.Schema) -> pl.Expr:
    """The raw reward written to shards: the `raw_reward` column where set, else the reward."""
    if c.RAW_REWARD in schema:
        return pl.coalesce(pl.col(c.RAW_REWARD), pl.col(c.REWARD_VALUE)).alias(c.RAW_REWARD)
    return pl.col(c.REWARD_VALUE).alias(c.RAW_REWARD)


def optional_columns(frame: pl.DataFrame) -> list[str]:
    """Optional input columns that go into shards, in shard column order."""

    def present(name: str) -> bool:
        if name not in frame.columns:
            # a per-token list the rank-bounded build reduced to whether each row has it
            flag = c.has_column(name)
            return flag in frame.columns and bool(frame.get_column(flag).any())
        if name in (c.WEIGHT_VERSIONS, c.WEIGHT_VERSION_SPANS):  # some row's list non-empty
            return bool(frame.select((pl.col(name).list.len() > 0).any()).item())
        return bool(frame.get_column(name).is_not_null().any())

    return [source for source in c.OPTIONAL_SHARD_SOURCES.values() if present(source)]


def present_columns(optional: list[str]) -> list[str]:
    """The optional shard columns a step really has, from its optional input columns."""
    return [name for name, source in c.OPTIONAL_SHARD_SOURCES.items() if source in optional]


def optional_shard_columns(optional: list[str]) -> list[pl.Expr]:
    """Every optional shard column: copied where the step has it, else typed nulls, so all
    steps share one column set."""
    return [
        pl.col(source).alias(name)
        if source in optional
        else pl.lit(None, dtype=c.DATASET_SCHEMA[name]).alias(name)
        for name, source in c.OPTIONAL_SHARD_SOURCES.items()
    ]
