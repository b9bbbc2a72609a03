"""What a step's manifest and rows must agree on before any trainer's conversion reads them.

Types alone let through a manifest whose values were changed: a `dp_size` of 1 on a step
of two ranks reads half the step as the whole, a smaller `max_prompt_length` puts verl's
tokens in the wrong columns. So every trainer's `read_rank` checks, besides the types and
the digests (`_manifest`, `_verify`), that the manifest agrees with itself (`check_layout`:
one rank file per rank, rows adding up to its counts, one entry per train step) and with
the rows read (`check_rows`: the batch positions of every rank and the dropped rows are
each of 0..n-1 once, the rank file's `step` and `rank` are the manifest's and the reader's,
and the trainer's widths hold every row). One ShardVerificationError naming the manifest
and what disagrees; no data.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rollout_shards_loader._convert import scalar_array
from rollout_shards_loader._folder import ShardVerificationError, rank_name

BATCH_POSITION = "batch_position"
RESPONSE_LENGTHS = "response_lengths"
TOTAL_LENGTHS = "total_lengths"


def _refuse(path: Path, what: str) -> ShardVerificationError:
    return ShardVerificationError(f"{path}: {what}: not the manifest its build wrote")


def check_layout(manifest: dict[str, Any], path: Path, trainer: str) -> None:
    """The manifest's fields agree with each other (its types already checked)."""
    dp = manifest["settings"]["dp_size"]
    ranks = [o for o in manifest["outputs"] if o["path"].startswith("rank=")]
    names = [o["path"] for o in ranks]
    if names != [rank_name(r) for r in range(dp)]:
        raise _refuse(path, f"`settings.dp_size` is {dp} but `outputs` lists {names}")
    counts = manifest["counts"]
    written = sum(o["rows"] for o in ranks)
    if written != counts["written"]:
        raise _refuse(
            path, f"the rank files hold {written} rows, `counts.written` says {counts['written']}"
        )
    dropped = len(manifest.get("dropped_positions", []))
    if dropped != counts["dropped"]:
        raise _refuse(
            path, f"{dropped} `dropped_positions`, `counts.dropped` says {counts['dropped']}"
        )
    steps = manifest.get("num_train_steps")
    for name in ("num_rollouts", "num_microbatches"):
        per_step = manifest.get(name)
        if type(steps) is int and per_step is not None and len(per_step) != steps:
            raise _refuse(path, f"`{name}` has {len(per_step)} entries for {steps} train steps")
    LAYOUTS.get(trainer, _nothing)(manifest, path, ranks)


def _verl_layout(manifest: dict[str, Any], path: Path, ranks: list[dict[str, Any]]) -> None:
    """verl trains `train_batch_size` prompts of `rollout_n` rows: in equal chunks per rank
    for the legacy trainer (`DataProto.chunk`); for V1 (which pads to the ranks itself) in
    the build's runs, rank r holding rows [ceil(r * rows / dp), ceil((r + 1) * rows / dp))."""
    settings = manifest["settings"]
    rows = settings["train_batch_size"] * settings["rollout_n"]
    dp = settings["dp_size"]
    per_rank = [o["rows"] for o in ranks]
    if settings.get("verl_target", "legacy") == "v1":
        runs = [-(-(r + 1) * rows // dp) + (-r * rows // dp) for r in range(dp)]
        if manifest["global_batch_size"] != rows or per_rank != runs:
            raise _refuse(
                path,
                f"train_batch_size x rollout_n = {rows} rows in V1 runs over dp_size={dp} "
                f"are {runs}, but `global_batch_size` is {manifest['global_batch_size']} and "
                f"the rank files hold {per_rank}",
            )
        return
    chunk = rows // dp
    if manifest["global_batch_size"] != rows:
        raise _refuse(
            path,
            f"`global_batch_size` is {manifest['global_batch_size']}, train_batch_size x "
            f"rollout_n = {rows}",
        )
    if rows % settings["dp_size"] or per_rank != [chunk] * settings["dp_size"]:
        raise _refuse(
            path,
            f"train_batch_size x rollout_n = {rows} rows over dp_size={settings['dp_size']}, "
            f"but the rank files hold {per_rank}",
        )


def _slime_layout(manifest: dict[str, Any], path: Path, ranks: list[dict[str, Any]]) -> None:
    """slime trains `global_batch_size` rollouts in each of `num_train_steps` steps (its
    `global_batch_sizes`), the configured size: no dynamic batch size."""
    gbs, steps = manifest["global_batch_size"], manifest["num_train_steps"]
    if gbs != manifest["settings"]["global_batch_size"]:
        raise _refuse(
            path,
            f"`global_batch_size` is {gbs}, `settings.global_batch_size` "
            f"{manifest['settings']['global_batch_size']}",
        )
    if manifest["num_rollouts"] != [gbs] * steps:
        raise _refuse(
            path,
            f"`num_rollouts` is {manifest['num_rollouts']}, not {steps} train steps of "
            f"global_batch_size={gbs}",
        )


def _nothing(manifest: dict[str, Any], path: Path, ranks: list[dict[str, Any]]) -> None:
    pass


LAYOUTS: dict[str, Callable[[dict[str, Any], Path, list[dict[str, Any]]], None]] = {
    "slime": _slime_layout,
    "verl": _verl_layout,
}


def check_rows(
    folder: Path,
    manifest: dict[str, Any],
    rank: int,
    own: pa.Buffer,
    parts: dict[int, pa.Table],
    trainer: str,
) -> None:
    """The rows read agree with the manifest: `own` is rank `rank`'s file, `parts` the other
    ranks' columns (each with `batch_position`)."""
    all_names = pq.read_schema(pa.BufferReader(own)).names
    names = {n for n in all_names if all_names.count(n) == 1}  # by name: those held once
    wanted = [BATCH_POSITION, *(n for n in ("step", "rank") if n in names)]
    wanted += [n for n in WIDTH_COLUMNS.get(trainer, ()) if n not in wanted]
    table = pq.read_table(pa.BufferReader(own), columns=wanted)
    where = folder / rank_name(rank)
    for name, want in (("step", manifest["step"]), ("rank", rank)):
        if name in names:
            values = table.column(name)
            if values.null_count or not bool((scalar_array(values) == want).all()):
                raise ShardVerificationError(
                    f"{where}: rows whose `{name}` is not {want}: not this step's rank {rank} file"
                )
    _check_positions(folder, manifest, rank, table, parts)
    if trainer in WIDTHS:  # every rank's rows: one that does not fit is the step's widths'
        tables = [table.select(list(WIDTH_COLUMNS[trainer]))]
        tables += [parts[r].select(list(WIDTH_COLUMNS[trainer])) for r in sorted(parts)]
        WIDTHS[trainer](folder / "manifest.json", manifest, pa.concat_tables(tables))


def _check_positions(
    folder: Path, manifest: dict[str, Any], rank: int, table: pa.Table, parts: dict[int, pa.Table]
) -> None:
    """Every rank's rows and the dropped rows have each batch position of 0..n-1 once, n the
    manifest's written and dropped rows: the ranks read are the whole step, each row once."""
    columns = [table.column(BATCH_POSITION)]
    columns += [parts[r].column(BATCH_POSITION) for r in sorted(parts)]
    arrays = [np.asarray(manifest.get("dropped_positions", []), dtype=np.int64)]
    for column in columns:
        if column.null_count or not pa.types.is_integer(column.type):
            raise _refuse(
                folder / "manifest.json", "a rank file's batch positions are not integers"
            )
        arrays.append(scalar_array(column).astype(np.int64, copy=False))
    positions = np.concatenate(arrays)
    n = manifest["counts"]["written"] + manifest["counts"]["dropped"]
    inside = bool(((positions >= 0) & (positions < n)).all())
    if len(positions) != n or not inside or np.bincount(positions, minlength=n).max(initial=1) != 1:
        raise ShardVerificationError(
            f"step {manifest['step']}: the rank files' batch positions and the manifest's "
            f"`dropped_positions` are not each of 0..{n - 1} once"
        )


def _verl_widths(path: Path, manifest: dict[str, Any], table: pa.Table) -> None:
    """Every row's prompt fits `max_prompt_length` and its response `max_response_length`:
    verl's tensors are padded to exactly those widths."""
    settings = manifest["settings"]
    response = scalar_array(table.column(RESPONSE_LENGTHS)).astype(np.int64)
    prompt = scalar_array(table.column(TOTAL_LENGTHS)).astype(np.int64) - response
    for name, lengths, width in (
        ("max_prompt_length", prompt, settings["max_prompt_length"]),
        ("max_response_length", response, settings["max_response_length"]),
    ):
        outside = lengths[(lengths < 0) | (lengths > width)]
        if len(outside):
            raise _refuse(
                path,
                f"`settings.{name}` is {width} but a row of the step is {int(outside[0])} "
                "tokens long",
            )


WIDTH_COLUMNS: dict[str, tuple[str, ...]] = {"verl": (RESPONSE_LENGTHS, TOTAL_LENGTHS)}
WIDTHS: dict[str, Callable[[Path, dict[str, Any], pa.Table], None]] = {"verl": _verl_widths}
