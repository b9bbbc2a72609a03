"""verl's data-parallel split: `_balance_batch` when `balance_batch` (Karmarkar-Karp on the
workload 24576 L + L^2 of each row's L tokens, equal counts, each partition smallest at both
ends), then `DataProto.chunk(dp_size)`: rank r takes the r-th equal run of rows. V1 balances
on the trainer: its rows stay in the step's order."""

from __future__ import annotations

import polars as pl

from pipeline.transforms.layout import Layout

# calculate_workload: 12 h^2 L + 2 h L^2 for h = 4096, divided by 2 h
WORKLOAD_PER_TOKEN = 24576


def balanced_order(lengths: pl.Series, dp_size: int) -> pl.Series:
    """`_balance_batch`'s row order: equal-count Karmarkar-Karp partitions of the workload,
    partition after partition, each sorted by (workload, position) and laid out with the
    smallest rows at both ends."""
    import numpy as np

    from pipeline.transforms.packing import karmarkar_karp

    tokens = lengths.cast(pl.Int64).to_numpy()
    workload = WORKLOAD_PER_TOKEN * tokens + tokens * tokens
    order = []
    for part in karmarkar_karp(workload, dp_size, equal_size=True):
        positions = np.asarray(part, dtype=np.int64)
        ranked = positions[np.lexsort((positions, workload[positions]))]
        order.append(np.concatenate([ranked[::2], ranked[1::2][::-1]]))
    return pl.Series(np.concatenate(order), dtype=pl.Int64)


def row_order(lengths: pl.Series, dp_size: int, balance: bool) -> pl.Series:
    """The rows' order as verl holds them: balanced, or the step's own."""
    if balance:
        return balanced_order(lengths, dp_size)
    return pl.int_range(len(lengths), dtype=pl.Int64, eager=True)


def chunked_layout(order: pl.Series, dp_size: int, num_rollouts: int) -> Layout:
    """`chunk(dp_size)` over the rows in `order`: contiguous runs, equal for legacy (its
    settings check says so), within one row of each other for V1, whose files are read back
    whole in rank order; one train step."""
    height = len(order)
    return Layout(
        order=order,
        rank=(pl.int_range(height, dtype=pl.Int64, eager=True) * dp_size // height).cast(pl.Int32),
        train_step=pl.repeat(0, height, dtype=pl.Int32, eager=True),
        micro_batch=None,
        dropped=pl.Series("dropped", [], dtype=pl.Int64),
        num_rollouts=[num_rollouts],
        num_microbatches=None,
        steps_per_rank=[1] * dp_size,
    )
