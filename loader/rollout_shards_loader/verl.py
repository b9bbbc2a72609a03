"""verl's side: a rank's `DataProto` as verl 0.9.1's `RayPPOTrainer.fit` hands it to that
data-parallel rank (`DataProto.chunk(dp_size)`), from a step built with `--trainer verl`.

The only module of the loader that imports verl (and torch and tensordict, which verl
brings): `import rollout_shards_loader` works without them.

The batch tensors are rebuilt from the rank file's rows as verl's agent loop pads them:
the prompt left-padded to `max_prompt_length` and the response right-padded to
`max_response_length` with the tokenizer's pad id, `response_mask` the loss mask on the
response, `position_ids` from the attention mask, the score at the last response token
(`rm_scores`, `token_level_scores`, `token_level_rewards`: one tensor, as in verl), the
GRPO advantage (`rewards`) on every response token the mask keeps (`advantages`, and the
same tensor as `returns`), `rollout_log_probs` right-padded with zeros when the step has
them, and the dataset's `dummy_tensor`. `non_tensor_batch` is {"uid": str(group_index)}
and `meta_info` {"global_token_num": ...} of the whole step, every rank's rows in order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rollout_shards_loader._step import RankFiles, read_rank_files


def _step_files(
    step_folder: str | Path, rank: int, verify: bool
) -> tuple[dict[str, Any], pa.Table, list[int]]:
    """The manifest, rank `rank`'s table and every rank's total lengths in rank order, from
    one build of the step, every file checked as `rollout_shards_loader.read_rank` checks
    them (another rank's file, of which `total_lengths` is read, by its whole sha256)."""
    return read_rank_files(
        step_folder,
        rank,
        None,
        None,
        verify,
        lambda read: _rank_table(read, rank),
        trainer="verl",
        other_columns=("batch_position", "response_lengths", "total_lengths"),
    )


def _rank_table(read: RankFiles, rank: int) -> tuple[dict[str, Any], pa.Table, list[int]]:
    table = pq.read_table(pa.BufferReader(read.own))
    lengths: list[int] = []
    for r in range(len(read.files)):
        part = table if r == rank else read.parts[r]
        lengths.extend(part.column("total_lengths").to_pylist())
    return read.manifest, table, lengths


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values and each value's row, as numpy arrays."""
    lists = column.combine_chunks()
    offsets = lists.offsets.to_numpy()
    values = lists.values.to_numpy(zero_copy_only=False)
    rows = np.repeat(np.arange(len(lists)), np.diff(offsets))
    within = np.arange(len(values)) - np.repeat(offsets[:-1], np.diff(offsets))
    return values, np.stack([rows, within])


def rank_tensors(table: pa.Table, manifest: dict[str, Any]) -> dict[str, Any]:
    """The padded batch tensors of a verl rank file's rows (`read_rank`'s batch), by name,
    in the order verl's batch holds them."""
    import torch

    settings = manifest["settings"]
    prompt_width, width = settings["max_prompt_length"], settings["max_response_length"]
    pad, rows = settings["pad_token_id"], table.num_rows
    response = table.column("response_lengths").to_numpy().astype(np.int64)
    prompt = table.column("total_lengths").to_numpy().astype(np.int64) - response
    tokens, (row, within) = _flat(table.column("tokens"))
    column = prompt_width - prompt[row] + within  # prompts end where responses begin
    input_ids = np.full((rows, prompt_width + width), pad, dtype=np.int64)
    input_ids[row, column] = tokens
    attention = np.zeros((rows, prompt_width + width), dtype=np.int64)
    attention[row, column] = 1
    mask_values, (mask_row, mask_at) = _flat(table.column("loss_masks"))
    response_mask = np.zeros((rows, width), dtype=np.int64)
    response_mask[mask_row, mask_at] = mask_values
    scores = np.zeros((rows, width), dtype=np.float32)
    # the last response token; an empty response's score lands in the last column
    scores[np.arange(rows), (response - 1) % width] = table.column("raw_reward").to_numpy()
    advantage = table.column("rewards").to_numpy().astype(np.float32)
    advantages = advantage[:, None] * response_mask.astype(np.float32)
    out = {
        "dummy_tensor": torch.zeros((rows, 1), dtype=torch.uint8),
        "prompts": torch.from_numpy(input_ids[:, :prompt_width].copy()),
        "responses": torch.from_numpy(input_ids[:, prompt_width:].copy()),
        "response_mask": torch.from_numpy(response_mask),
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attention),
        "position_ids": torch.from_numpy(np.maximum(np.cumsum(attention, axis=1) - 1, 0)),
    }
    if "rollout_log_probs" in manifest.get("present_columns", []):
        values, (lp_row, lp_at) = _flat(table.column("rollout_log_probs"))
        log_probs = np.zeros((rows, width), dtype=np.float32)
        log_probs[lp_row, lp_at] = values
        out["rollout_log_probs"] = torch.from_numpy(log_probs)
    token_scores = torch.from_numpy(scores)
    out["rm_scores"] = out["token_level_scores"] = out["token_level_rewards"] = token_scores
    out["advantages"] = out["returns"] = torch.from_numpy(advantages)
    return out


def read_rank(step_folder: str | Path, rank: int, *, verify: bool = True) -> Any:
    """Rank `rank`'s `verl.DataProto` of a step built with `--trainer verl`: the chunk verl's
    trainer hands that rank (module docstring). With `verify`, every rank file is checked
    against the manifest's sha256 and row count (ShardVerificationError)."""
    try:
        from tensordict import TensorDict
        from verl import DataProto
    except ModuleNotFoundError as missing:
        raise ImportError(
            f"rollout_shards_loader.verl.read_rank runs in verl's environment ({missing.name} "
            "is not installed): install the loader where verl 0.9.1 is"
        ) from None

    manifest, table, lengths = _step_files(step_folder, rank, verify)
    tensors = rank_tensors(table, manifest)
    uid = table.column("group_index").cast(pa.string()).to_numpy(zero_copy_only=False)
    return DataProto(
        batch=TensorDict(tensors, batch_size=(table.num_rows,)),
        non_tensor_batch={"uid": uid.astype(object)},
        meta_info={"global_token_num": lengths},
    )
