"""The rollout-side schedule (SEMANTICS 7) and the balanced data-parallel split (6).

Both plan on per-row length arrays only: they return row positions, and the caller
gathers the heavy columns into rank order once.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import polars as pl

from pipeline.errors import step_error
from pipeline.transforms.layout import Layout
from pipeline.transforms.packing import first_fit_decreasing, karmarkar_karp, split_bins


@dataclass(frozen=True)
class _Plan:
    """The settings the schedule reads, checked and with defaults applied."""

    global_batch_size: int
    dp_size: int
    align: int
    align_text: str
    token_cap: int | None  # set exactly when micro-batches are dynamic
    micro_batch_size: int | None
    allow_partial_train_step: bool
    balance_data: bool


@dataclass(frozen=True)
class _Rollouts:
    """Rows grouped by rollout: rollouts in order of first appearance, rows in batch order."""

    rows: np.ndarray  # int64 row positions, rollout after rollout
    starts: np.ndarray  # int64, len R + 1: rollout j's rows are rows[starts[j]:starts[j + 1]]

    @property
    def count(self) -> int:
        return len(self.starts) - 1


@dataclass(frozen=True)
class _StepRows:
    """One train step's rows, rank after rank, each rank's in the order it trains them."""

    rows: np.ndarray  # int64 row positions
    rank: np.ndarray  # int32
    micro_batch: np.ndarray  # int32, within the rank
    per_rank: int  # micro-batches per rank


def _schedule_plan(settings: Any) -> _Plan:
    gbs = settings.global_batch_size
    dp = settings.dp_size
    cp = settings.cp_size
    vpp = settings.vpp_size if settings.vpp_size is not None else 1
    if gbs is None or gbs < 1 or dp < 1:
        raise step_error(
            "schedule_settings",
            f"global_batch_size={gbs} and dp_size={dp} must both be at least 1",
        )
    if cp is None or cp < 1:
        raise step_error(
            "schedule_settings", f"the rollout-side schedule needs cp_size of at least 1, got {cp}"
        )
    align, align_text = dp, f"dp_size={dp}"
    if vpp > 1:
        group = settings.microbatch_group_size_per_vp_stage
        if group is None or group < 1:
            raise step_error(
                "schedule_settings",
                f"vpp_size={vpp} needs microbatch_group_size_per_vp_stage of at least 1, "
                f"got {group}",
            )
        align = dp * group
        align_text = f"dp_size*microbatch_group_size_per_vp_stage={dp}*{group}={align}"
    token_cap = None
    micro_batch_size = settings.micro_batch_size
    if settings.use_dynamic_batch_size:
        if settings.max_tokens_per_gpu is None or settings.max_tokens_per_gpu < 1:
            raise step_error(
                "schedule_settings",
                "use_dynamic_batch_size needs max_tokens_per_gpu of at least 1, "
                f"got {settings.max_tokens_per_gpu}",
            )
        token_cap = settings.max_tokens_per_gpu * cp
    elif micro_batch_size is None or micro_batch_size < 1:
        raise step_error(
            "schedule_settings",
            f"static micro-batches need micro_batch_size of at least 1, got {micro_batch_size}: "
            "set micro_batch_size, or use_dynamic_batch_size with max_tokens_per_gpu",
        )
    return _Plan(
        global_batch_size=gbs,
        dp_size=dp,
        align=align,
        align_text=align_text,
        token_cap=token_cap,
        micro_batch_size=micro_batch_size,
        allow_partial_train_step=bool(settings.allow_partial_train_step),
        balance_data=bool(settings.balance_data),
    )


def _rollouts_in_order(rollout_keys: np.ndarray) -> _Rollouts:
    _, first_rows, key_of_row = np.unique(rollout_keys, return_index=True, return_inverse=True)
    by_appearance = np.argsort(first_rows, kind="stable")
    ordinal_of_key = np.empty_like(by_appearance)
    ordinal_of_key[by_appearance] = np.arange(len(by_appearance))
    ordinal_of_row = ordinal_of_key[key_of_row.reshape(-1)]
    rows = np.argsort(ordinal_of_row, kind="stable").astype(np.int64)
    sizes = np.bincount(ordinal_of_row, minlength=len(first_rows))
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    return _Rollouts(rows=rows, starts=starts)


def _rollouts_per_step(rollouts: _Rollouts, plan: _Plan) -> list[int]:
    """Full steps of global_batch_size rollouts, plus the leftover as a partial step when
    it is allowed, dynamic, and holds a row for every rank."""
    total = rollouts.count
    full = total // plan.global_batch_size
    if full == 0:
        raise step_error(
            "schedule_no_full_step",
            f"the batch has {total} distinct rollouts, fewer than global_batch_size="
            f"{plan.global_batch_size}: lower global_batch_size or collect more rollouts",
        )
    counts = [plan.global_batch_size] * full
    leftover = total - full * plan.global_batch_size
    if leftover and plan.allow_partial_train_step and plan.token_cap is not None:
        first = full * plan.global_batch_size
        leftover_rows = int(rollouts.starts[total] - rollouts.starts[first])
        if leftover_rows >= plan.dp_size:
            counts.append(leftover)
    return counts


def _aligned_count(count: int, align: int) -> int:
    return max(-(-count // align) * align, align)


def _static_micro_batches(n_rows: int, plan: _Plan, step: int) -> list[list[int]]:
    size = plan.micro_batch_size
    assert size is not None
    count = -(-n_rows // size)
    if count != _aligned_count(count, plan.align):
        raise step_error(
            "schedule_alignment",
            f"micro-batch count {count} of train step {step} ({n_rows} rows in chunks of "
            f"micro_batch_size={size}) is not a multiple of {plan.align_text}: change "
            "micro_batch_size, global_batch_size or dp_size so that the rows per step are "
            "a multiple of micro_batch_size times that, or use use_dynamic_batch_size",
        )
    return [list(range(start, min(start + size, n_rows))) for start in range(0, n_rows, size)]


def _flops_micro_batches(
    lengths: np.ndarray, flops: np.ndarray, cap: int, step: int
) -> list[list[int]]:
    """balance_by_flops (SEMANTICS 7.7): as many micro-batches as the step's tokens fill at
    the cap, balanced by FLOPs (the cap itself is not kept), or one row each when that
    many would be at least the rows."""
    count = max(1, -(-int(lengths.sum()) // cap))
    if count >= len(lengths):
        return [[row] for row in range(len(lengths))]
    bins = karmarkar_karp(flops, count, equal_size=False)
    if not all(bins):
        raise step_error(
            "schedule_empty_micro_batch",
            f"train step {step}: balancing {len(lengths)} rows by FLOPs into {count} "
            "micro-batches leaves one empty (miles asserts there): turn off balance_by_flops "
            "or change max_tokens_per_gpu",
        )
    return bins


def _dynamic_micro_batches(
    lengths: np.ndarray, plan: _Plan, step: int, flops: np.ndarray | None
) -> list[list[int]]:
    assert plan.token_cap is not None
    if flops is None:
        bins = first_fit_decreasing(lengths, plan.token_cap)
    else:
        bins = _flops_micro_batches(lengths, flops, plan.token_cap, step)
    target = _aligned_count(len(bins), plan.align)
    if len(bins) != target:
        bins = split_bins(bins, lengths, target)
    if len(bins) != target:
        raise step_error(
            "schedule_cannot_split",
            f"train step {step} has {len(lengths)} rows, which split into at most {len(bins)} "
            f"micro-batches, but it needs {target} (a multiple of {plan.align_text}): lower "
            "dp_size or microbatch_group_size_per_vp_stage, or raise global_batch_size",
        )
    return bins


def _micro_batches_per_rank(
    bin_sums: np.ndarray, plan: _Plan, bins: list[list[int]], flops: np.ndarray | None
) -> list[list[int]]:
    count = len(bin_sums)
    if flops is not None:
        # each micro-batch's FLOPs summed row by row in its order, as miles' `sum` does
        row_flops = flops.tolist()
        weights = [sum((row_flops[row] for row in rows), 0.0) for rows in bins]
        return karmarkar_karp(weights, plan.dp_size, equal_size=True)
    if plan.balance_data:
        return karmarkar_karp(bin_sums.tolist(), plan.dp_size, equal_size=True)
    return [list(range(rank, count, plan.dp_size)) for rank in range(plan.dp_size)]


def _schedule_step(
    rows: np.ndarray, lengths: np.ndarray, plan: _Plan, step: int, flops: np.ndarray | None
) -> _StepRows:
    """Pack one train step's rows into micro-batches and deal them out to the ranks (by
    FLOPs when `flops`, each row's forward FLOPs in batch order, is given)."""
    if len(rows) < plan.dp_size:
        raise step_error(
            "schedule_too_few_rows",
            f"train step {step} has {len(rows)} rows, fewer than dp_size={plan.dp_size}, so "
            "some rank would get none: lower dp_size or raise global_batch_size",
        )
    step_lengths = lengths[rows]
    step_flops = None if flops is None else flops[rows]
    if plan.token_cap is None:
        bins = _static_micro_batches(len(rows), plan, step)
    else:
        bins = _dynamic_micro_batches(step_lengths, plan, step, step_flops)
    local = np.fromiter(chain.from_iterable(bins), dtype=np.int64, count=len(rows))
    sizes = np.fromiter(map(len, bins), dtype=np.int64, count=len(bins))
    bin_of_entry = np.repeat(np.arange(len(bins)), sizes)
    bin_sums = np.add.reduceat(step_lengths[local], np.cumsum(sizes) - sizes)
    # Rank r's micro-batches take write slots r*per_rank .. (r+1)*per_rank-1.
    slot_of_bin = np.empty(len(bins), dtype=np.int64)
    per_rank_bins = _micro_batches_per_rank(bin_sums, plan, bins, step_flops)
    slot_of_bin[np.concatenate(per_rank_bins)] = np.arange(len(bins))
    slot_of_entry = slot_of_bin[bin_of_entry]
    write = np.argsort(slot_of_entry, kind="stable")
    per_rank = len(bins) // plan.dp_size
    return _StepRows(
        rows=rows[local[write]],
        rank=(slot_of_entry[write] // per_rank).astype(np.int32),
        micro_batch=(slot_of_entry[write] % per_rank).astype(np.int32),
        per_rank=per_rank,
    )


def rollout_schedule(
    rollout_keys: np.ndarray, lengths: np.ndarray, settings: Any, flops: np.ndarray | None = None
) -> Layout:
    """Train steps of whole rollouts, packed into micro-batches and spread over dp ranks.

    `rollout_keys` holds each row's rollout key (rollout_id, else index) in batch order,
    `lengths` its total token length; `settings` has the names of CONTRACT section 3.
    `flops` (float64 per row, `transforms.flops`) balances micro-batches and ranks by
    FLOPs instead of tokens (balance_by_flops; dynamic micro-batches only).
    """
    plan = _schedule_plan(settings)
    keys = np.asarray(rollout_keys, dtype=np.int64)
    row_lengths = np.asarray(lengths, dtype=np.int64)
    rollouts = _rollouts_in_order(keys)
    num_rollouts = _rollouts_per_step(rollouts, plan)
    steps = []
    first_rollout = 0
    for step, count in enumerate(num_rollouts):
        start = rollouts.starts[first_rollout]
        end = rollouts.starts[first_rollout + count]
        steps.append(_schedule_step(rollouts.rows[start:end], row_lengths, plan, step, flops))
        first_rollout += count
    rank = np.concatenate([part.rank for part in steps])
    rank_major = np.argsort(rank, kind="stable")
    train_step = np.repeat(
        np.arange(len(steps), dtype=np.int32), [len(part.rows) for part in steps]
    )
    return Layout(
        order=pl.Series("order", np.concatenate([part.rows for part in steps])[rank_major]),
        rank=pl.Series("rank", rank[rank_major]),
        train_step=pl.Series("train_step", train_step[rank_major]),
        micro_batch=pl.Series(
            "micro_batch", np.concatenate([part.micro_batch for part in steps])[rank_major]
        ),
        dropped=pl.Series("dropped", np.sort(rollouts.rows[rollouts.starts[first_rollout] :])),
        num_rollouts=num_rollouts,
        num_microbatches=[part.per_rank for part in steps],
        steps_per_rank=[len(steps)] * plan.dp_size,
    )


def balanced_rank_partitions(lengths: np.ndarray, dp_size: int) -> list[np.ndarray]:
    """Equal-count partitions of rows balancing total length (balance_data without a
    schedule): rank r gets the r-th partition, in ascending row order."""
    n_rows = len(lengths)
    if dp_size < 1 or n_rows % dp_size:
        raise step_error(
            "balance_not_divisible",
            f"balance_data needs the row count to be divisible by dp_size, but {n_rows} rows "
            f"do not split into dp_size={dp_size} equal parts: change dp_size or "
            "global_batch_size, or turn off balance_data",
        )
    values = np.asarray(lengths, dtype=np.int64).tolist()
    return [
        np.asarray(part, dtype=np.int64)
        for part in karmarkar_karp(values, dp_size, equal_size=True)
    ]
