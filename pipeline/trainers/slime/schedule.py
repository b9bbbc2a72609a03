"""slime's DP and micro-batch schedule (THUDM/slime `slime/utils/dp_schedule.py` at the
pinned commit), which slime always runs on the rollout side, on per-row length arrays.

Where it differs from miles' (`trainers.miles.schedule`): train steps hold exactly
`global_batch_size` rollouts and the trailing ones are dropped (no partial step);
token-budget micro-batches are packed first-fit in row order (not by length descending);
`balance_by_flops` packs into ceil(tokens / cap) micro-batches by Karmarkar-Karp on each
row's forward FLOPs, without the cap; `balance_data` deals micro-batches to ranks by
Karmarkar-Karp on their FLOPs, not their tokens. FLOPs are slime's `calculate_fwd_flops`
in Python float arithmetic, in its order of operations (its sums exceed 2**53 for real
models, so the order decides the bits and the partitions).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import polars as pl

from pipeline.errors import step_error
from pipeline.transforms.flops import ModelShape, forward_flops
from pipeline.transforms.layout import Layout
from pipeline.transforms.packing import first_fit, karmarkar_karp


def split_to(bins: list[list[int]], target: int, lengths: list[int]) -> None:
    """Halve the heaviest bin of two or more rows (ties: the later) until `target` bins:
    rows by length descending, each to the lighter half (the first on ties)."""
    while len(bins) < target:
        heavy = [(sum(lengths[i] for i in b), j) for j, b in enumerate(bins) if len(b) > 1]
        if not heavy:
            return
        _, j = max(heavy)
        halves: list[list[int]] = [[], []]
        sums = [0, 0]
        for row in sorted(bins[j], key=lambda i: -lengths[i]):
            side = 0 if sums[0] <= sums[1] else 1
            halves[side].append(row)
            sums[side] += lengths[row]
        bins[j] = halves[0]
        bins.append(halves[1])


@dataclass(frozen=True)
class SlimeLayout:
    """What the schedule needs of the settings (slime's defaults applied)."""

    global_batch_size: int
    dp_size: int
    align: int
    cap: int | None
    micro_batch_size: int
    balance_data: bool
    balance_by_flops: bool
    shape: ModelShape | None  # the model's, for FLOPs (`balance_data`, `balance_by_flops`)


def _step_bins(lengths: list[int], plan: SlimeLayout, step: int) -> list[list[int]]:
    if plan.cap is None:
        size = plan.micro_batch_size
        bins = [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]
    elif plan.balance_by_flops and plan.shape is not None:
        wanted = max(1, -(-sum(lengths) // plan.cap))
        if wanted >= len(lengths):
            bins = [[i] for i in range(len(lengths))]
        else:
            flops = forward_flops(np.asarray(lengths), plan.shape).tolist()
            bins = karmarkar_karp(flops, wanted, equal_size=False)
    else:
        bins = first_fit(lengths, plan.cap)
    target = max(-(-len(bins) // plan.align) * plan.align, plan.align)
    if target != len(bins):
        if plan.cap is None:
            raise step_error(
                "schedule_alignment",
                f"train step {step}: {len(bins)} micro-batches of micro_batch_size="
                f"{plan.micro_batch_size} ({len(lengths)} rows) are not a multiple of "
                f"{plan.align} (dp_size times microbatch_group_size_per_vp_stage when "
                "vpp_size > 1), which slime asserts: change micro_batch_size or "
                "global_batch_size, or use use_dynamic_batch_size",
            )
        split_to(bins, target, lengths)
        if len(bins) != target:
            raise step_error(
                "schedule_cannot_split",
                f"train step {step} has {len(lengths)} rows, at most {len(bins)} micro-batches, "
                f"but slime needs {target}: lower dp_size or raise global_batch_size",
            )
    if any(not b for b in bins):
        raise step_error(
            "schedule_empty_micro_batch",
            f"train step {step}: splitting rows of no tokens leaves an empty micro-batch",
        )
    return bins


def slime_layout(ids: np.ndarray, lengths: np.ndarray, plan: SlimeLayout) -> Layout:
    """Steps of `global_batch_size` whole rollouts (rollouts in order of first appearance,
    trailing ones dropped), packed into micro-batches and dealt to the ranks."""
    keys, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    appearance = np.argsort(first, kind="stable")
    ordinal = np.empty_like(appearance)
    ordinal[appearance] = np.arange(len(appearance))
    rollout_of_row = ordinal[inverse.reshape(-1)]
    rows_by_rollout = np.argsort(rollout_of_row, kind="stable")
    starts = np.concatenate(([0], np.cumsum(np.bincount(rollout_of_row, minlength=len(keys)))))
    gbs, dp = plan.global_batch_size, plan.dp_size
    steps = len(keys) // gbs
    if steps < 1:
        raise step_error(
            "schedule_no_full_step",
            f"the batch has {len(keys)} rollouts, fewer than global_batch_size={gbs} (slime "
            "counts rollouts per train step): lower global_batch_size",
        )
    parts: list[list[tuple[np.ndarray, int, np.ndarray]]] = [[] for _ in range(dp)]
    counts = []
    for step in range(steps):
        rows = rows_by_rollout[starts[step * gbs] : starts[(step + 1) * gbs]]
        if len(rows) < dp:
            raise step_error(
                "schedule_too_few_rows",
                f"train step {step} has {len(rows)} rows, fewer than dp_size={dp}: lower "
                "dp_size or raise global_batch_size",
            )
        step_lengths = lengths[rows].tolist()
        bins = _step_bins(step_lengths, plan, step)
        counts.append(len(bins) // dp)
        if plan.balance_data and plan.shape is not None:
            flops = forward_flops(np.asarray(step_lengths), plan.shape).tolist()
            weights = [sum(flops[i] for i in b) for b in bins]
            owners = karmarkar_karp(weights, dp, equal_size=True)
        else:
            owners = [list(range(r, len(bins), dp)) for r in range(dp)]
        for r, owned in enumerate(owners):
            local = np.fromiter(chain.from_iterable(bins[b] for b in owned), dtype=np.int64)
            sizes = [len(bins[b]) for b in owned]
            parts[r].append((rows[local], step, np.repeat(np.arange(len(owned)), sizes)))
    rank_parts = [part for rank_steps in parts for part in rank_steps]
    order = np.concatenate([rows for rows, _, _ in rank_parts])
    sizes = [len(rows) for rows, _, _ in rank_parts]
    per_rank = [sum(len(rows) for rows, _, _ in rank_steps) for rank_steps in parts]
    dropped = np.sort(rows_by_rollout[starts[steps * gbs] :])
    return Layout(
        order=pl.Series("order", order, dtype=pl.Int64),
        rank=pl.Series("rank", np.repeat(np.arange(dp), per_rank), dtype=pl.Int32),
        train_step=pl.Series(
            "train_step", np.repeat([step for _, step, _ in rank_parts], sizes), dtype=pl.Int32
        ),
        micro_batch=pl.Series(
            "micro_batch", np.concatenate([micro for _, _, micro in rank_parts]), dtype=pl.Int32
        ),
        dropped=pl.Series("dropped", dropped, dtype=pl.Int64),
        num_rollouts=[gbs] * steps,
        num_microbatches=counts,
        steps_per_rank=[steps] * dp,
    )
