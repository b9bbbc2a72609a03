"""miles' side of the shards: its rank dict (`read_rank`) and the hook that trains a miles
run from rollout-shards step folders without a fork of miles.

`read_rank(step_folder, rank)` gives the dict miles' trainer holds after
`process_rollout_data` for that rank. miles builds it in `_package_shards` (per-row keys
gathered by the rank's partition, batch-wide keys copied whole) and completes it in
`process_rollout_data_shard` (`partition` popped, `total_lengths` reordered into the rank's
rows). A rank file holds its rows in that order already; the dict is its columns as the
same Python lists, the batch-wide `raw_reward` gathered from every rank's file and the
manifest.

The hook: miles' trainer gets its rank's data in one call: `get_rollout_data(args,
rollout_data_ref, ...)` in `miles/backends/training_utils/data.py` calls
`process_rollout_data(args, rollout_data_ref, dp_rank, dp_size, ...)`, a name imported into
that module from `miles/utils/data.py` and so looked up there at call time. The training
actor's `train(self, rollout_id, rollout_data_ref, ...)` knows the step.

`install(root)` wraps both: `train` sets the rollout id for the duration of the call, and
`process_rollout_data` waits for `<root>/step=<rollout_id>` to be built (up to `wait_s`,
`ROLLOUT_SHARDS_WAIT_S`), then returns `read_rank(<root>/step=<rollout_id>, dp_rank, ...)`
in the shape the installed miles expects: since miles #591 the pair `(rank dict, handle)`
whose handle `train()` enters as a context (`ObjectStoreGetResult`), before it the rank
dict alone.

Ray takes an actor's methods when it loads the actor class in a worker, so the wrapping
must happen before that: `runtime_env(root)` gives the Ray runtime environment whose
`worker_process_setup_hook` installs in every worker before any actor is created, and the
wrapping itself waits until miles' trainer modules are imported. A `process_rollout_data`
call outside a wrapped `train` means the install came too late (Ray kept the unwrapped
`train`): it raises instead of handing the trainer the rollout side's own batch.
"""

from __future__ import annotations

import contextvars
import functools
import os
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rollout_shards_loader._convert import (
    is_list,
    lists,
    optional_ints,
    ragged,
    scalar_array,
    scalars,
)
from rollout_shards_loader._folder import ShardVerificationError
from rollout_shards_loader._imports import LOCK, PatchingFinder
from rollout_shards_loader._step import RankFiles, read_rank_files, wait_for_step
from rollout_shards_loader._verify import BATCH_POSITION, RAW_REWARD

# Per-row keys in the order miles' `_package_shards` gathers them (those the shards carry).
ROW_KEYS = (
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
    "teacher_log_probs",
    "weight_versions",
)
# Shard columns miles hands the trainer only when the batch has them.
OPTIONAL = ("round_number", "rollout_log_probs", "teacher_log_probs", "weight_versions")
# Shard columns that are ours or that miles does not hand the trainer.
NOT_HANDED = ("batch_position", "train_step", "micro_batch", "metadata", "step", "rank")

DATA_MODULE = "miles.backends.training_utils.data"
ACTORS = (
    "miles.backends.megatron_utils.actor:MegatronTrainRayActor",
    "miles.backends.fsdp_utils.actor:FSDPTrainRayActor",
)
ROOT_ENV = "ROLLOUT_SHARDS_ROOT"
# How long the hook waits for a step to be built before it fails (seconds): long enough
# for a build running alongside training to commit the step the trainer asks for next.
WAIT_ENV = "ROLLOUT_SHARDS_WAIT_S"
WAIT_S = 600.0
SETUP_HOOK = "rollout_shards_loader.miles.setup_hook"
ORIGINAL = "_rollout_shards_original"  # not __wrapped__: miles' own decorators set that
# miles' handle class since #591; a data module without it returns the rank dict alone.
PAIR_MARKER = "ObjectStoreGetResult"

_ROLLOUT_ID: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "rollout_shards_rollout_id", default=None
)


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
    probs, `weight_versions`) a `Ragged(values, offsets, valid)`, row i being
    `values[offsets[i]:offsets[i + 1]]`. The batch-wide ints and lists
    (`dynamic_global_batch_size`, the schedule's keys) stay Python.

    `with_train_step=True` adds the key `train_step` (not miles'): per row, the optimizer
    step of this rollout step that trains it, None for a row never trained (as numpy, an
    int32 masked array, masked where None).

    Every file read is checked against the manifest (`verify=False` skips the digests and
    row counts, not the rest): the rank's own file by its sha256, another rank's file by
    the digest of the two columns read of it (`raw_reward_sha256`; by its sha256 when the
    manifest has none), each by its row count. A mismatch, a manifest of another step or
    with a field of another JSON type, or a file that is a symbolic link raises
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
    present = _present(manifest, read.files)
    scheduled = manifest.get("num_microbatches") is not None
    wanted = [k for k in ROW_KEYS if k not in OPTIONAL or k in present]
    extra = [BATCH_POSITION, RAW_REWARD, "total_lengths"]
    if scheduled:
        extra += ["train_step", "micro_batch"]
    elif with_train_step:
        extra.append("train_step")
    table = pq.read_table(pa.BufferReader(read.own), columns=[*wanted, *extra])

    data: dict[str, Any] = {}
    for key in wanted:
        column = table.column(key)
        if as_numpy:
            data[key] = ragged(column) if is_list(column) else scalar_array(column)
        elif is_list(column):
            data[key] = lists(column, null_empty=key == "weight_versions")
        else:
            data[key] = scalars(column)
    data["raw_reward"] = _batch_raw_reward(manifest, read.parts, rank, table, as_numpy)
    total = table.column("total_lengths")
    data["total_lengths"] = scalar_array(total) if as_numpy else scalars(total)
    dynamic = manifest.get("dynamic_global_batch_size")
    if dynamic is not None:
        data["dynamic_global_batch_size"] = dynamic
    if scheduled:
        data["num_microbatches"] = list(manifest["num_microbatches"])
        data["micro_batch_indices"] = _micro_batch_indices(table)
        data["num_rollouts"] = list(manifest["num_rollouts"])
    if with_train_step:
        data["train_step"] = optional_ints(table.column("train_step"), as_numpy)
    return data


def _present(manifest: dict[str, Any], files: list[pq.ParquetFile]) -> set[str]:
    """The optional columns of this batch: the manifest's `present_columns` when it lists
    them (every step then has every column, null where absent), else the files' columns."""
    listed = manifest.get("present_columns")
    if listed is not None:
        return set(listed) & set(OPTIONAL)
    names: set[str] = set()
    for parquet in files:
        names.update(parquet.schema_arrow.names)
    return names & set(OPTIONAL)


def _batch_raw_reward(
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
    flat_positions = np.concatenate(positions)
    _check_positions(flat_positions, manifest)
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


def _check_positions(positions: np.ndarray, manifest: dict[str, Any]) -> None:
    """The rank files' and the dropped rows' batch positions are each of 0..n-1 once, so
    every value of the batch-wide `raw_reward` is set exactly once."""
    n = len(positions)
    inside = bool(((positions >= 0) & (positions < n)).all())
    if not inside or np.bincount(positions, minlength=n).max(initial=1) != 1:
        raise ShardVerificationError(
            f"step {manifest['step']}: the rank files' batch positions and the manifest's "
            f"`dropped_positions` are not each of 0..{n - 1} once"
        )


def _micro_batch_indices(table: pa.Table) -> list[list[int]]:
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


class LateInstallError(RuntimeError):
    """`process_rollout_data` ran outside a wrapped `train`: Ray loaded the actor class
    before `install`, so the trainer would train on the rollout side's batch."""


def runtime_env(
    root: str | Path, base: dict[str, Any] | None = None, *, wait_s: float | None = None
) -> dict[str, Any]:
    """The Ray runtime environment (for `ray job submit --runtime-env-json` or
    `ray.init(runtime_env=...)`) that installs the hook in every worker of the job before
    any actor exists: `base` plus `worker_process_setup_hook` and `ROLLOUT_SHARDS_ROOT`
    (and `ROLLOUT_SHARDS_WAIT_S` when `wait_s` is given)."""
    env = dict(base or {})
    if env.get("worker_process_setup_hook") not in (None, SETUP_HOOK):
        raise ValueError(
            "the runtime env already has a worker_process_setup_hook "
            f"({env['worker_process_setup_hook']!r}): call "
            "rollout_shards_loader.miles.install(root) from it instead"
        )
    env["worker_process_setup_hook"] = SETUP_HOOK
    env_vars = {**env.get("env_vars", {}), ROOT_ENV: str(root)}
    if wait_s is not None:
        env_vars[WAIT_ENV] = str(_wait_seconds(wait_s, "wait_s"))
    env["env_vars"] = env_vars
    return env


def setup_hook() -> None:
    """Ray's `worker_process_setup_hook`: `install($ROLLOUT_SHARDS_ROOT)`."""
    root = os.environ.get(ROOT_ENV)
    if not root:
        raise RuntimeError(
            f"{SETUP_HOOK} needs {ROOT_ENV} in the runtime env's env_vars "
            "(rollout_shards_loader.miles.runtime_env(root) sets both)"
        )
    install(root)


def install(
    root: str | Path,
    *,
    data_module: str = DATA_MODULE,
    actors: Sequence[str] = ACTORS,
    wait_s: float | None = None,
) -> None:
    """Make miles' trainer read rank data from `<root>/step=<rollout_id>/`.

    Modules already imported are patched now; the others when they are imported (nothing
    of miles is imported here). `actors` are the `module:Class` training actors whose
    `train(rollout_id, ...)` is wrapped; `data_module` the module whose
    `process_rollout_data` the trainer calls. A step not built yet is waited for up to
    `wait_s` seconds (unset: `$ROLLOUT_SHARDS_WAIT_S`, else 600; 0 fails at once), then
    fails naming the command that builds it. Installing twice wraps once."""
    if wait_s is None:
        wait = _wait_seconds(os.environ.get(WAIT_ENV, WAIT_S), WAIT_ENV)
    else:
        wait = _wait_seconds(wait_s, "wait_s")
    targets: dict[str, list[str]] = {data_module: []}
    for target in actors:
        module, _, name = target.partition(":")
        targets.setdefault(module, []).append(name)
    with LOCK:
        _Finder.root = Path(root)
        _Finder.wait_s = wait
        for module, names in targets.items():
            _Finder.targets[module] = (module == data_module, tuple(names))
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
        for module in targets:
            if module in sys.modules:
                _patch(sys.modules[module])


def _wait_seconds(value: Any, name: str) -> float:
    """A wait in seconds: a finite number >= 0 (from a string, as an env var gives it)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or not 0 <= seconds < float("inf"):
        raise ValueError(f"{name}={value!r}: the wait for a step is seconds, a number >= 0")
    return seconds


def uninstall() -> None:
    """Undo `install`: the original functions back in the modules already imported, and
    later imports left alone."""
    with LOCK:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
        for name, (is_data, actors) in _Finder.targets.items():
            module = sys.modules.get(name)
            if module is None:
                continue
            if is_data:
                function = module.process_rollout_data
                module.process_rollout_data = getattr(function, ORIGINAL, function)  # type: ignore[attr-defined]
            for actor_name in actors:
                actor = getattr(module, actor_name, None)
                if actor is not None:
                    actor.train = getattr(actor.train, ORIGINAL, actor.train)
        _Finder.targets.clear()


def _patch(module: types.ModuleType) -> None:
    is_data, actors = _Finder.targets[module.__name__]
    if is_data:
        _patch_data(module, _Finder.root, _Finder.wait_s)
    for name in actors:
        actor = getattr(module, name, None)
        if actor is not None:
            actor.train = _with_rollout_id(getattr(actor.train, ORIGINAL, actor.train))


def _patch_data(data: types.ModuleType, root: Path, wait_s: float) -> None:
    current = data.process_rollout_data
    original = getattr(current, ORIGINAL, current)
    handle_class = getattr(data, PAIR_MARKER, None)

    @functools.wraps(original)
    def process_rollout_data(
        args: Any, rollout_data_ref: Any, dp_rank: int, dp_size: int, *rest: Any, **kwargs: Any
    ) -> Any:
        rollout_id = _ROLLOUT_ID.get()
        if rollout_id is None:
            raise LateInstallError(
                "rollout_shards_loader.miles.install ran after Ray loaded the training actor "
                "class, so train() is not wrapped and would train on the rollout side's "
                "batch; install it before the actor exists: pass "
                "rollout_shards_loader.miles.runtime_env(root) as the job's runtime env "
                "(worker_process_setup_hook)"
            )
        if getattr(args, "enable_witness", False):
            raise ValueError("rollout-shards steps carry no witness ids: turn off --enable-witness")
        folder = root / f"step={rollout_id}"
        wait_for_step(folder, wait_s)
        gbs = getattr(args, "global_batch_size", None)
        data = read_rank(folder, dp_rank, dp_size=dp_size, global_batch_size=gbs)
        if handle_class is None:
            return data
        return data, handle_class(value=data, release_fn=_release_nothing)

    setattr(process_rollout_data, ORIGINAL, original)
    data.process_rollout_data = process_rollout_data  # type: ignore[attr-defined]


def _release_nothing(value: Any) -> None:
    """The shards' dict holds no object-store buffer to release."""


def _with_rollout_id(train: Any) -> Any:
    @functools.wraps(train)
    def wrapped(self: Any, rollout_id: int, *args: Any, **kwargs: Any) -> Any:
        token = _ROLLOUT_ID.set(int(rollout_id))
        try:
            return train(self, rollout_id, *args, **kwargs)
        finally:
            _ROLLOUT_ID.reset(token)

    setattr(wrapped, ORIGINAL, train)
    return wrapped


class _Finder(PatchingFinder):
    """Patches miles' trainer modules right after they are executed, before the importer
    (Ray loading the actor class) sees them."""

    root: Path = Path(".")
    wait_s: float = WAIT_S
    targets: dict[str, tuple[bool, tuple[str, ...]]] = {}

    def __init__(self) -> None:
        super().__init__(_Finder.targets, _patch)
