"""Where each row trains: train step and data-parallel rank (SEMANTICS sections 6 and 7)."""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline import columns as c
from pipeline.settings import Settings
from pipeline.transforms.schedule import (
    UNTRAINED,
    Layout,
    balanced_rank_partitions,
    rollout_schedule,
)


def rank_train_steps(parts: list[np.ndarray], local_batch: int) -> tuple[np.ndarray, list[int]]:
    """SEMANTICS 6.1: local row j of a rank trains in step j // local_batch, for the rank's
    whole steps only; the rest get UNTRAINED. Also each rank's number of whole steps."""
    steps = [len(part) // local_batch for part in parts]
    local = [np.arange(len(part), dtype=np.int64) for part in parts]
    train_step = [
        np.where(j < n * local_batch, j // local_batch, UNTRAINED).astype(np.int32)
        for j, n in zip(local, steps, strict=True)
    ]
    return (np.concatenate(train_step) if parts else np.zeros(0, np.int32)), steps


def plain_layout(keys: np.ndarray, lengths: np.ndarray, settings: Settings) -> Layout:
    """Strided (or balanced) ranks; the trainer steps through each rank's rows in chunks of
    global_batch_size // dp_size (SEMANTICS 6.1), whatever their batch positions."""
    n = len(keys)
    positions = np.arange(n, dtype=np.int64)
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
    train_step, steps_per_rank = rank_train_steps(parts, settings.global_batch_size // dp)
    steps = max(steps_per_rank, default=0)
    trained = train_step != UNTRAINED
    # distinct rollouts per train step (a hash count: np.unique over pairs sorts them)
    per_step = (
        pl.DataFrame({"step": train_step[trained], "key": keys[order][trained]})
        .group_by("step")
        .agg(pl.col("key").n_unique())
    )
    num_rollouts = np.zeros(steps, dtype=np.int64)
    num_rollouts[per_step.get_column("step").to_numpy()] = per_step.get_column("key").to_numpy()
    return Layout(
        order=order,
        rank=rank,
        train_step=train_step,
        micro_batch=None,
        dropped=np.zeros(0, dtype=np.int64),
        num_rollouts=num_rollouts.tolist(),
        num_microbatches=None,
        steps_per_rank=steps_per_rank,
    )


def batch_layout(light: pl.DataFrame, settings: Settings) -> Layout:
    """The rollout-side schedule when cp_size is set and there are enough rollouts, else plain."""
    keys = light.get_column(c.ROLLOUT_IDS).to_numpy()
    lengths = light.get_column(c.TOTAL_LENGTHS).to_numpy().astype(np.int64)
    if settings.uses_schedule and len(np.unique(keys)) >= settings.global_batch_size:
        return rollout_schedule(keys, lengths, settings)
    return plain_layout(keys, lengths, settings)
