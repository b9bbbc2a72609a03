"""A `torch.utils.data` view of one rank of a step, with a collate for ragged rows.

The rank's rows come from `rollout_shards_loader.read_rank`, in the rank's training order,
without the rows the trainer never trains (`train_step` None: past the rank's last whole
optimizer step, SEMANTICS 6.1); a batch pads `tokens` to its longest row (with `pad_id`)
and `loss_masks` to its longest response (with 0), and keeps the lengths so a loss can
unpad.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from rollout_shards_loader import read_rank
from torch.utils.data import DataLoader, Dataset

PER_ROW = ("tokens", "loss_masks", "rewards", "response_lengths", "total_lengths")


class RankRows(Dataset):
    """The i-th trained row of the rank: its tokens, loss mask, reward, lengths and the
    optimizer step (`train_step`) that trains it."""

    def __init__(self, step_folder: str | Path, rank: int) -> None:
        self.data = read_rank(step_folder, rank, with_train_step=True)
        steps = self.data["train_step"]
        self.rows = [i for i, step in enumerate(steps) if step is not None]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        return {key: self.data[key][row] for key in (*PER_ROW, "train_step")}


def pad_collate(rows: list[dict[str, Any]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Ragged rows -> padded tensors plus the lengths to unpad them."""
    width = max(len(row["tokens"]) for row in rows)
    mask_width = max(len(row["loss_masks"]) for row in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    loss_masks = torch.zeros((len(rows), mask_width), dtype=torch.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row["tokens"])] = torch.tensor(row["tokens"], dtype=torch.long)
        loss_masks[i, : len(row["loss_masks"])] = torch.tensor(row["loss_masks"], dtype=torch.int32)
    return {
        "tokens": tokens,
        "loss_masks": loss_masks,
        "rewards": torch.tensor([row["rewards"] for row in rows], dtype=torch.float32),
        "response_lengths": torch.tensor([row["response_lengths"] for row in rows]),
        "total_lengths": torch.tensor([row["total_lengths"] for row in rows]),
        "train_step": torch.tensor([row["train_step"] for row in rows]),
    }


def rank_loader(step_folder: str | Path, rank: int, batch_size: int) -> DataLoader:
    """Batches of trained rows in the rank's training order (no shuffling: the order is
    the schedule). A batch size dividing the rank's rows per optimizer step keeps each
    batch within one step (`batch["train_step"]` says which)."""
    return DataLoader(
        RankRows(step_folder, rank), batch_size=batch_size, shuffle=False, collate_fn=pad_collate
    )
