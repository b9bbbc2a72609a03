"""Where each row trains: train step and data-parallel rank (SEMANTICS sections 6 and 7).

Polars only: numpy is imported with the rollout-side schedule or balance_data, which need it.
"""

from __future__ import annotations

import polars as pl

from pipeline.trainers import Settings
from pipeline.transforms.layout import UNTRAINED, Layout, rank_sizes, rows_within_ranks


def plain_layout(keys: pl.Series, lengths: pl.Series, settings: Settings) -> Layout:
    """Strided (or balanced) ranks; the trainer steps through each rank's rows in chunks of
    global_batch_size // dp_size (SEMANTICS 6.1), whatever their batch positions."""
    n = len(keys)
    dp = settings.dp_size
    assert settings.global_batch_size is not None, "a trainer's profile requires it"
    local_batch = settings.global_batch_size // dp
    if settings.balance_data:
        from pipeline.trainers.miles.schedule import balanced_rank_partitions  # numpy

        parts = balanced_rank_partitions(lengths.to_numpy(), dp)
        written = pl.DataFrame(
            {
                "order": pl.concat([pl.Series(part, dtype=pl.Int64) for part in parts]),
                "rank": pl.concat(
                    [
                        pl.repeat(r, len(part), dtype=pl.Int32, eager=True)
                        for r, part in enumerate(parts)
                    ]
                ),
            }
        )
    else:
        # rank r takes rows r, r + dp, ...: positions sorted by (position mod dp), stably
        written = (
            pl.select(order=pl.int_range(n, dtype=pl.Int64))
            .with_columns(rank=(pl.col("order") % dp).cast(pl.Int32))
            .sort("rank", maintain_order=True)
        )
    order, rank = written.get_column("order"), written.get_column("rank")
    steps_per_rank = [size // local_batch for size in rank_sizes(rank, dp)]
    local = rows_within_ranks(rank, dp)
    whole = pl.Series(steps_per_rank, dtype=pl.Int64).gather(rank) * local_batch
    trained = written.with_columns(
        pl.when(pl.lit(local < whole))
        .then(pl.lit(local // local_batch))
        .otherwise(UNTRAINED)
        .cast(pl.Int32)
        .alias("train_step"),
        keys.gather(order).alias("key"),
    )
    train_step = trained.get_column("train_step")
    # distinct rollouts per train step (a hash count); every step up to the most any rank
    # runs has rows, on the rank that runs the most
    per_step = (
        trained.filter(pl.col("train_step") != UNTRAINED)
        .group_by("train_step")
        .agg(pl.col("key").n_unique())
        .sort("train_step")
    )
    return Layout(
        order=order,
        rank=rank,
        train_step=train_step,
        micro_batch=None,
        dropped=pl.Series("dropped", [], dtype=pl.Int64),
        num_rollouts=per_step.get_column("key").to_list(),
        num_microbatches=None,
        steps_per_rank=steps_per_rank,
    )
