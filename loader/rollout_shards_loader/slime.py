"""Train a slime run (THUDM/slime) from rollout-shards step folders built with
`--trainer slime`.

`read_rank(step_folder, rank)` gives exactly what slime's
`slime.utils.data.process_rollout_data(args, refs, rank, dp_size)` returns for that rank
after slime's own conversion and split (`RolloutManager._convert_samples_to_train_data`,
`_split_train_data_by_dp`, `tensorize_rollout_data_for_training`): the same keys in the
same order, per-row tensors where slime makes them (`tokens` int64, `loss_masks` int32,
log probs float32, `rollout_mask_sums` one float32 tensor), Python lists elsewhere, floats
bit for bit. It needs torch, which every slime trainer has; the rest of the loader does not.

slime's Megatron actor calls `process_rollout_data` by the name it imported into
`slime/backends/megatron_utils/actor.py`, from `_get_rollout_data`, inside
`MegatronTrainRayActor.train(self, rollout_id, rollout_data_ref, ...)`. `install(root)`
wraps both, as `rollout_shards_loader.miles` does for miles: `train` sets the rollout id for
the call, and `process_rollout_data` returns `read_rank(<root>/step=<rollout_id>, dp_rank)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rollout_shards_loader import _hook
from rollout_shards_loader._convert import ragged, scalars
from rollout_shards_loader._rank import (
    FAMILY_ROW_KEYS,
    batch_raw_reward,
    micro_batch_indices,
    present,
)
from rollout_shards_loader._step import RankFiles, read_rank_files
from rollout_shards_loader._verify import BATCH_POSITION, RAW_REWARD

TRAINER = "slime"
DATA_MODULE = "slime.backends.megatron_utils.actor"
ACTORS = ("slime.backends.megatron_utils.actor:MegatronTrainRayActor",)
SETUP_HOOK = "rollout_shards_loader.slime.setup_hook"
SOURCE_NAMES = "source_names"

# Per-row keys in the order slime's `_split_train_data_by_dp` gathers them (those the
# shards carry), and the dtype of the tensors `tensorize_rollout_data_for_training` makes.
ROW_KEYS = (*FAMILY_ROW_KEYS, SOURCE_NAMES, "teacher_log_probs")
# slime copies these only when the batch's first sample has them (all rows or none here).
OPTIONAL = ("round_number", "rollout_log_probs", "teacher_log_probs")
TENSOR_LISTS = {
    "tokens": "int64",
    "loss_masks": "int32",
    "rollout_log_probs": "float32",
    "teacher_log_probs": "float32",
}


def read_rank(
    step_folder: str | Path,
    rank: int,
    *,
    dp_size: int | None = None,
    global_batch_size: int | None = None,
    verify: bool = True,
) -> dict[str, Any]:
    """Rank `rank`'s rollout data exactly as slime's `process_rollout_data` returns it.

    `dp_size` and `global_batch_size` (slime's `--global-batch-size`: rollouts per train
    step), when given, must match the step's, else ValueError; a step built for another
    trainer is a ValueError too. Every file is checked against the manifest as
    `rollout_shards_loader.read_rank` checks it (`verify=False` skips the digests). Without
    torch (slime's environment has it) an ImportError of one line says where to run it."""
    _need_torch()
    return read_rank_files(
        step_folder,
        rank,
        dp_size,
        global_batch_size,
        verify,
        lambda read: _slime_dict(read, rank),
        trainer=TRAINER,
    )


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as missing:
        raise ImportError(
            f"rollout_shards_loader.slime.read_rank runs in slime's environment ({missing.name} "
            "is not installed): install the loader where slime runs"
        ) from None


def _tensors(column: pa.ChunkedArray, dtype: str) -> list[Any]:
    """A list column as one tensor per row, each over its own slice of one converted array
    (null rows as empty tensors; the rules leave none where slime reads one)."""
    import torch

    rows = ragged(column)
    values = np.array(rows.values, dtype=dtype)  # a writable copy in the tensor's dtype
    pieces = np.split(values, rows.offsets[1:-1]) if len(rows.offsets) > 1 else []
    return [torch.from_numpy(piece) for piece in pieces]


def _slime_dict(read: RankFiles, rank: int) -> dict[str, Any]:
    import torch

    manifest, parts, own = read.manifest, read.parts, read.own
    has = present(manifest, read.files, OPTIONAL)
    wanted = [k for k in ROW_KEYS if k not in OPTIONAL or k in has]
    extra = [BATCH_POSITION, RAW_REWARD, "total_lengths", "train_step", "micro_batch"]
    table = pq.read_table(pa.BufferReader(own), columns=[*wanted, *extra])
    partition = scalars(table.column(BATCH_POSITION))
    data: dict[str, Any] = {"partition": partition}
    for key in wanted:
        column = table.column(key)
        if key in TENSOR_LISTS:
            data[key] = _tensors(column, TENSOR_LISTS[key])
        elif key == "rollout_mask_sums":
            sums = column.to_numpy().astype(np.float32)
            data[key] = torch.from_numpy(sums)
        else:
            data[key] = scalars(column)
    raw_reward = batch_raw_reward(manifest, parts, rank, table, False)
    data["raw_reward"] = raw_reward
    data["total_lengths"] = scalars(table.column("total_lengths"))
    steps = int(manifest["num_train_steps"])
    data["global_batch_sizes"] = [int(manifest["global_batch_size"])] * steps
    data["num_microbatches"] = list(manifest["num_microbatches"])
    data["micro_batch_indices"] = micro_batch_indices(table)
    data["local_raw_reward"] = [raw_reward[i] for i in partition]
    return data


def runtime_env(root: str | Path, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Ray runtime environment that installs the hook in every worker before any actor
    exists (`rollout_shards_loader.miles.runtime_env`, with this module's setup hook)."""
    return _hook.runtime_env(root, base, hook=SETUP_HOOK)


def setup_hook() -> None:
    """Ray's `worker_process_setup_hook`: `install($ROLLOUT_SHARDS_ROOT)`."""
    install(_hook.setup_root(SETUP_HOOK))


def install(
    root: str | Path, *, data_module: str = DATA_MODULE, actors: Sequence[str] = ACTORS
) -> None:
    """Make slime's Megatron trainer read rank data from `<root>/step=<rollout_id>/`:
    modules already imported are patched now, the others when imported."""
    _hook.install(root, data_module=data_module, actors=actors, reader=read_rank, owner=__name__)


def uninstall() -> None:
    """Undo `install`."""
    _hook.uninstall()
