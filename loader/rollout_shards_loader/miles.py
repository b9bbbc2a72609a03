"""miles' side of the shards: its rank dict (`read_rank`) and the hook that trains a miles
run from rollout-shards step folders without a fork of miles (`install`, `runtime_env`:
`rollout_shards_loader._hook`, with miles' modules).

`read_rank(step_folder, rank)` gives the dict miles' trainer holds after
`process_rollout_data` for that rank. miles builds it in `_package_shards` (per-row keys
gathered by the rank's partition, batch-wide keys copied whole) and completes it in
`process_rollout_data_shard` (`partition` popped, `total_lengths` reordered into the rank's
rows). A rank file holds its rows in that order already; the dict is its columns as the
same Python lists, the batch-wide `raw_reward` gathered from every rank's file and the
manifest. miles' trainer calls `process_rollout_data` from
`miles/backends/training_utils/data.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rollout_shards_loader import _hook
from rollout_shards_loader._convert import (
    is_list,
    lists,
    optional_ints,
    ragged,
    scalar_array,
    scalars,
)
from rollout_shards_loader._hook import (
    ORIGINAL,
    PAIR_MARKER,
    ROOT_ENV,
    WAIT_ENV,
    WAIT_S,
    LateInstallError,
)
from rollout_shards_loader._rank import (
    FAMILY_ROW_KEYS,
    batch_raw_reward,
    micro_batch_indices,
    present,
)
from rollout_shards_loader._step import RankFiles, read_rank_files
from rollout_shards_loader._verify import BATCH_POSITION, RAW_REWARD

__all__ = [
    "ORIGINAL",
    "PAIR_MARKER",
    "ROOT_ENV",
    "WAIT_ENV",
    "WAIT_S",
    "LateInstallError",
    "install",
    "read_rank",
    "runtime_env",
    "setup_hook",
    "uninstall",
]

# Per-row keys in the order miles' `_package_shards` gathers them (those the shards carry):
# the family's (`_rank.FAMILY_ROW_KEYS`), then miles' own; as the rank-file columns they are
# read from (KEY_OF: a column handed under another key).
_OWN_KEYS = (
    "rollout_sampling_mask_ids",
    "rollout_sampling_mask_offsets",
    "teacher_log_probs",
    "weight_versions",
    "weight_version_spans",
)
ROW_KEYS = (*FAMILY_ROW_KEYS, *_OWN_KEYS)
# Shard columns miles hands the trainer only when the batch has them.
OPTIONAL = ("round_number", "rollout_log_probs", *_OWN_KEYS)
# miles' `weight_versions` is one version string per generation call up to its PR #1891,
# per call a list of `{"version", "abs_start", "abs_end"}` dicts since (`to_dicts`); a step
# holds one form, in the column of that form. None of a row's spans is `[]`, as miles
# gives a sample without calls.
SPANS = "weight_version_spans"
KEY_OF = {SPANS: "weight_versions"}
# Shard columns that are ours or that miles does not hand the trainer.
NOT_HANDED = ("batch_position", "train_step", "micro_batch", "metadata", "step", "rank")

DATA_MODULE = "miles.backends.training_utils.data"
ACTORS = (
    "miles.backends.megatron_utils.actor:MegatronTrainRayActor",
    "miles.backends.fsdp_utils.actor:FSDPTrainRayActor",
)
SETUP_HOOK = "rollout_shards_loader.miles.setup_hook"


def read_rank(
    step_folder: str | Path,
    rank: int,
    *,
    dp_size: int | None = None,
    global_batch_size: int | None = None,
    as_numpy: bool = False,
    with_train_step: bool = False,
    verify: bool = True,
) -> dict[str, Any]:
    """Rank `rank`'s rollout data exactly as miles' trainer holds it after
    `process_rollout_data`: the same keys, values and Python types.

    `dp_size` and `global_batch_size` (the trainer's configured `--global-batch-size`, not
    the dynamic one), when given, must match the step's settings, else ValueError.

    With `as_numpy=True` the same keys hold numpy instead of Python lists: a per-row
    scalar key (and `raw_reward`) one array; a ragged key (`tokens`, `loss_masks`, log
    probs, `weight_versions` of strings) a `Ragged(values, offsets, valid)`, row i being
    `values[offsets[i]:offsets[i + 1]]`; `weight_versions` of spans stays the lists of
    dicts, which numpy has no form for. The batch-wide ints and lists
    (`dynamic_global_batch_size`, the schedule's keys) stay Python.

    `with_train_step=True` adds the key `train_step` (not miles'): per row, the optimizer
    step of this rollout step that trains it, None for a row never trained (as numpy, an
    int32 masked array, masked where None).

    Every file read is checked against the manifest (`verify=False` skips the digests, not
    the rest): the rank's own file by its sha256, another rank's file by the digest of the
    two columns read of it (`raw_reward_sha256`; by its sha256 when the manifest has none),
    each by its row count; the manifest by its `manifest_sha256`, its fields' JSON types and
    their agreement with each other and with the rows (`_consistent`). A mismatch, a
    manifest of another step, or a file that is a symbolic link raises
    ShardVerificationError naming the file. A rebuild of the step during the read makes
    it start over on the new folder (up to 8 times), so the dict is always one build's.
    """
    return read_rank_files(
        step_folder,
        rank,
        dp_size,
        global_batch_size,
        verify,
        lambda read: _rank_dict(read, rank, as_numpy, with_train_step),
    )


def _rank_dict(read: RankFiles, rank: int, as_numpy: bool, with_train_step: bool) -> dict[str, Any]:
    manifest = read.manifest
    has = present(manifest, read.files, OPTIONAL)
    scheduled = manifest.get("num_microbatches") is not None
    wanted = [k for k in ROW_KEYS if k not in OPTIONAL or k in has]
    extra = [BATCH_POSITION, RAW_REWARD, "total_lengths"]
    if scheduled:
        extra += ["train_step", "micro_batch"]
    elif with_train_step:
        extra.append("train_step")
    table = pq.read_table(pa.BufferReader(read.own), columns=[*wanted, *extra])

    data: dict[str, Any] = {}
    for name in wanted:
        column, key = table.column(name), KEY_OF.get(name, name)
        if name == SPANS:  # nested dicts: pyarrow's own Python values, as miles' to_dicts
            data[key] = [[] if row is None else row for row in column.to_pylist()]
        elif as_numpy:
            data[key] = ragged(column) if is_list(column) else scalar_array(column)
        elif is_list(column):
            data[key] = lists(column, null_empty=key == "weight_versions")
        else:
            data[key] = scalars(column)
    data["raw_reward"] = batch_raw_reward(manifest, read.parts, rank, table, as_numpy)
    total = table.column("total_lengths")
    data["total_lengths"] = scalar_array(total) if as_numpy else scalars(total)
    dynamic = manifest.get("dynamic_global_batch_size")
    if dynamic is not None:
        data["dynamic_global_batch_size"] = dynamic
    if scheduled:
        data["num_microbatches"] = list(manifest["num_microbatches"])
        data["micro_batch_indices"] = micro_batch_indices(table)
        data["num_rollouts"] = list(manifest["num_rollouts"])
    if with_train_step:
        data["train_step"] = optional_ints(table.column("train_step"), as_numpy)
    return data


def runtime_env(
    root: str | Path, base: dict[str, Any] | None = None, *, wait_s: float | None = None
) -> dict[str, Any]:
    """The Ray runtime environment (for `ray job submit --runtime-env-json` or
    `ray.init(runtime_env=...)`) that installs the hook in every worker of the job before
    any actor exists: `base` plus `worker_process_setup_hook` and `ROLLOUT_SHARDS_ROOT`
    (and `ROLLOUT_SHARDS_WAIT_S` when `wait_s` is given)."""
    return _hook.runtime_env(root, base, hook=SETUP_HOOK, wait_s=wait_s)


def setup_hook() -> None:
    """Ray's `worker_process_setup_hook`: `install($ROLLOUT_SHARDS_ROOT)`."""
    install(_hook.setup_root(SETUP_HOOK))


def install(
    root: str | Path,
    *,
    data_module: str = DATA_MODULE,
    actors: Sequence[str] = ACTORS,
    wait_s: float | None = None,
) -> None:
    """Make miles' trainer read rank data from `<root>/step=<rollout_id>/` (`_hook.install`
    with this module's `read_rank`). A step not built yet is waited for up to `wait_s`
    seconds (unset: `$ROLLOUT_SHARDS_WAIT_S`, else 600; 0 fails at once), then fails naming
    the command that builds it. Installing twice wraps once."""
    _hook.install(
        root,
        data_module=data_module,
        actors=actors,
        reader=read_rank,
        owner=__name__,
        wait_s=wait_s,
    )


def uninstall() -> None:
    """Undo `install`: the original functions back in the modules already imported, and
    later imports left alone."""
    _hook.uninstall()
