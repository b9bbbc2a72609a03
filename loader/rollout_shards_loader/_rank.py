"""What every trainer's rank dict of the Megatron family (miles, slime) computes alike from
a verified read: the optional columns a batch has, the batch-wide `raw_reward` gathered
from every rank's file and the manifest, and the micro-batches of the rollout-side
schedule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rollout_shards_loader._convert import scalar_array
from rollout_shards_loader._verify import BATCH_POSITION, RAW_REWARD

# The per-row keys both trainers gather first, in their order (slime's
# `_split_train_data_by_dp` and miles' `_package_shards`, its descendant); each adds its own
# after them.
FAMILY_ROW_KEYS = (
    "tokens",
    "response_lengths",
    "rewards",
    "truncated",
    "loss_masks",
    "round_number",
    "sample_indices",
    "rollout_ids",
    "rollout_mask_sums",
    "rollout_log_probs",
)


def present(
    manifest: dict[str, Any], files: list[pq.ParquetFile], optional: Sequence[str]
) -> set[str]:
    """The optional columns of this batch: the manifest's `present_columns` when it lists
    them (every step then has every column, null where absent), else the files' columns."""
    listed = manifest.get("present_columns")
    if listed is not None:
        return set(listed) & set(optional)
    names: set[str] = set()
    for parquet in files:
        names.update(parquet.schema_arrow.names)
    return names & set(optional)


def batch_raw_reward(
    manifest: dict[str, Any],
    parts: dict[int, pa.Table],
    rank: int,
    table: pa.Table,
    as_numpy: bool,
) -> Any:
    """`raw_reward` of the whole trimmed batch in batch order: every rank's rows (`parts`:
    the other ranks' `batch_position` and `raw_reward`), and the rows the rollout-side
    schedule dropped (recorded in the manifest)."""
    positions = [np.asarray(manifest.get("dropped_positions", []), dtype=np.int64)]
    columns: list[pa.ChunkedArray] = []
    for other in range(len(parts) + 1):
        part = table if other == rank else parts[other]
        positions.append(scalar_array(part.column(BATCH_POSITION)).astype(np.int64))
        columns.append(part.column(RAW_REWARD))
    flat_positions = np.concatenate(positions)  # each of 0..n-1 once (`check_rows`)
    dropped = list(manifest.get("dropped_raw_reward", []))
    if as_numpy or not any(c.null_count for c in columns):
        arrays = [scalar_array(c) for c in columns]
        dtype = np.result_type(*arrays) if arrays else np.float64
        values = np.concatenate([np.asarray(dropped, dtype=dtype), *arrays])
        batch = np.empty(len(flat_positions), dtype=values.dtype)
        batch[flat_positions] = values
        return batch if as_numpy else batch.tolist()
    chunks = [dropped, *(c.to_pylist() for c in columns)]
    batch = np.empty(len(flat_positions), dtype=object)
    batch[flat_positions] = np.fromiter(
        (v for chunk in chunks for v in chunk), dtype=object, count=len(flat_positions)
    )
    return batch.tolist()


def micro_batch_indices(table: pa.Table) -> list[list[int]]:
    """miles' `micro_batch_indices[rank]`: per train step and micro-batch, in the rank's
    order, the local row positions of that micro-batch."""
    step = table.column("train_step").combine_chunks().to_numpy(zero_copy_only=False)
    micro = table.column("micro_batch").combine_chunks().to_numpy(zero_copy_only=False)
    n = len(step)
    if n == 0:
        return []
    change = np.flatnonzero((step[1:] != step[:-1]) | (micro[1:] != micro[:-1])) + 1
    bounds = [0, *change.tolist(), n]
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
