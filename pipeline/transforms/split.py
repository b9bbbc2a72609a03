"""Where each row trains: train step and data-parallel rank (SEMANTICS sections 6 and 7)."""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline import columns as c
from pipeline.settings import Settings
from pipeline.transforms.schedule import Layout, balanced_rank_partitions, rollout_schedule


def rollout_ordinals(keys: np.ndarray) -> np.ndarray:
    """For each row, the rank of its rollout key in order of first appearance."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order_of_first = np.argsort(np.argsort(first, kind="stable"), kind="stable")
    return order_of_first[inverse]


def plain_layout(
    keys: np.ndarray, lengths: np.ndarray, settings: Settings, compact: bool
) -> Layout:
    """Strided (or balanced) ranks; train step = the global batch holding the row."""
    n = len(keys)
    positions = np.arange(n, dtype=np.int64)
    unit = rollout_ordinals(keys) if compact else positions
    train_step = (unit // settings.global_batch_size).astype(np.int32)
    dp = settings.dp_size
    if settings.balance_data:
        parts = balanced_rank_partitions(lengths, dp)
    else:
        parts = [positions[r::dp] for r in range(dp)]
    order = np.concatenate(parts).astype(np.int64) if n else positions
    rank = (
        np.concatenate([np.full(len(p), r, dtype=np.int32) for r, p in enumerate(parts)])
        if n
        else np.zeros(0, np.int32)
    )
    steps = int(train_step.max()) + 1 if n else 0
    pairs = np.unique(np.stack([train_step.astype(np.int64), keys]), axis=1)
    num_rollouts = np.bincount(pairs[0], minlength=steps).tolist()
    return Layout(
        order=order,
        rank=rank,
        train_step=train_step[order],
        micro_batch=None,
        dropped=np.zeros(0, dtype=np.int64),
        num_rollouts=num_rollouts,
        num_microbatches=None,
    )


def batch_layout(light: pl.DataFrame, settings: Settings, compact: bool) -> Layout:
    """The rollout-side schedule when cp_size is set and there are enough rollouts, else plain."""
    keys = light.get_column(c.ROLLOUT_IDS).to_numpy()
    lengths = light.get_column(c.TOTAL_LENGTHS).to_numpy().astype(np.int64)
    if settings.uses_schedule and len(np.unique(keys)) >= settings.global_batch_size:
        return rollout_schedule(keys, lengths, settings)
    return plain_layout(keys, lengths, settings, compact)
