"""docs/examples/torch_dataset.py: the Dataset and padding collate over a built rank."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from tests.support.samples import REPO, build, sample, write_step

spec = importlib.util.spec_from_file_location(
    "torch_dataset", REPO / "docs" / "examples" / "torch_dataset.py"
)
assert spec is not None and spec.loader is not None
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


def test_batches_pad_ragged_rows_in_training_order(tmp_path: Path) -> None:
    rows = [sample(i, response_length=1 + i, reward=float(i % 2)) for i in range(8)]
    rows[2]["loss_mask"] = [1, 0, 1]
    write_step(tmp_path / "in", rows)
    build(tmp_path / "in", tmp_path / "out", global_batch_size=4, dp_size=2)
    batches = list(example.rank_loader(tmp_path / "out" / "step=1", rank=0, batch_size=3))
    assert [b["tokens"].shape[0] for b in batches] == [3, 1]
    first = batches[0]
    # rank 0 holds rows 0, 2, 4, 6: lengths 3, 5, 7 in the first batch
    assert first["total_lengths"].tolist() == [3, 5, 7]
    assert first["tokens"].shape == (3, 7)
    assert first["tokens"][0].tolist() == [0, 1, 2, 0, 0, 0, 0]
    assert first["loss_masks"].tolist() == [
        [1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 1, 1, 1],
    ]
    assert first["rewards"].dtype == torch.float32
    assert first["response_lengths"].tolist() == [1, 3, 5]


def test_untrained_rows_are_skipped(tmp_path: Path) -> None:
    # 11 rows, trim off, G 4, dp 1: steps 0 and 1 train rows 0-7, rows 8-10 never train
    rows = [sample(i, response_length=1 + i % 3, reward=float(i)) for i in range(11)]
    write_step(tmp_path / "in", rows)
    build(
        tmp_path / "in",
        tmp_path / "out",
        global_batch_size=4,
        disable_rollout_trim_samples=True,
    )
    batches = list(example.rank_loader(tmp_path / "out" / "step=1", rank=0, batch_size=4))
    assert [b["train_step"].tolist() for b in batches] == [[0] * 4, [1] * 4]
    lengths = [b["response_lengths"].tolist() for b in batches]
    assert lengths == [[1 + i % 3 for i in range(4)], [1 + i % 3 for i in range(4, 8)]]
