"""One step from sample files to a committed shard folder, in three stages.

`load_samples` (read, type, repair, validate), `plan_batch` (trim, columns, rewards,
layout) and `write_shards` (atomic step folder with manifest) are what the Dagster
assets `rollout_samples`, `train_batch` and `training_shards` call; `build_step` runs
all three for the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError
from pipeline.io import writer
from pipeline.io.readers import PATH_STEP, TYPE_ERROR, SourceFile, load_step, sha256_of
from pipeline.schemas.validate import REASON, ROW_ID, TRAJECTORY, load_models, validate_step
from pipeline.settings import Settings
from pipeline.transforms import samples as s
from pipeline.transforms.repair import CLEARED, STAMPED, repair_rollout_ids
from pipeline.transforms.rewards import with_rewards
from pipeline.transforms.schedule import Layout
from pipeline.transforms.shard_columns import (
    light_shard_columns,
    loss_masks,
    optional_columns,
    raw_reward,
)
from pipeline.transforms.split import batch_layout
from pipeline.transforms.trim import is_compact, plan_trim

PROVENANCE = (c.SOURCE_FILE, c.SOURCE_ROW, PATH_STEP)
# Provenance as the quarantine table names it: where to find the row as it was written.
QUARANTINE_PROVENANCE = {c.SOURCE_FILE: "source_file", c.SOURCE_ROW: "source_row"}
SIBLING = "sibling of an invalid leaf: "
# Rank files written at once. Each holds one rank's gathered rows in memory; Polars
# already spreads one file's encoding over the cores it can use.
RANK_WRITERS = 2
# Staged assets (Dagster) are written once and read once: lz4 writes 3-4x faster than
# Polars' default zstd, and groups of 4096 rows are read back in parallel.
STAGING_PARQUET: dict[str, Any] = {"compression": "lz4", "row_group_size": 4096}


@dataclass
class SampleTable:
    """A step's valid rows in batch order (the `rollout_samples` asset)."""

    step: int
    frame: pl.DataFrame
    inputs: list[dict[str, Any]]
    ignored_columns: list[str]
    ingested: int
    repaired: dict[str, int] = field(default_factory=dict)
    quarantine: pl.DataFrame | None = None


@dataclass
class RankRows:
    """The shard columns of a batch before the list columns are gathered into write order."""

    scalars: pl.DataFrame  # the scalar shard columns and `rank`, in write order
    inputs: pl.DataFrame  # the input columns the list shard columns come from, in batch order
    optional: list[str]  # optional input columns that go into shards, in shard order
    order: np.ndarray  # the batch position of each row in write order

    def rows(self, start: int, length: int) -> pl.DataFrame:
        """Rows [start, start + length) in write order with every column, gathered."""
        picked = self.inputs[pl.Series(self.order[start : start + length])]
        lists = picked.select(
            pl.col(c.TOKENS),
            loss_masks(picked.schema),
            *(
                pl.col(name).alias(c.METADATA if name == c.TRAIN_METADATA else name)
                for name in self.optional
            ),
        )
        scalars = _compact(self.scalars, start, length)
        return pl.concat([scalars, lists], how="horizontal").select(
            *c.SHARD_COLUMNS, *lists.columns[2:], c.RANK
        )


def _compact(frame: pl.DataFrame, start: int, length: int) -> pl.DataFrame:
    """Rows [start, start + length) copied into buffers of their own. Polars sizes Parquet
    pages by a column's whole buffers, so a slice of a larger frame would be written with
    other page boundaries than the same rows held alone: every rank file is written from
    a copy, whichever path (CLI or staged Dagster batch) produced the rows."""
    return frame[pl.Series(np.arange(start, start + length, dtype=np.int64))]


class TrainBatch:
    """The trimmed batch in write order with its shard columns and metadata (`train_batch`).

    `frame` holds every shard column and `rank`, rank 0's rows first, each in training
    order. plan_batch hands over the list columns still in batch order (RankRows): `frame`
    gathers them on first use, while write_shards gathers one rank at a time, so a build
    never holds a second copy of the step's tokens.
    """

    def __init__(
        self,
        step: int,
        frame: pl.DataFrame | RankRows,
        meta: dict[str, Any],
        quarantine: pl.DataFrame | None = None,
    ) -> None:
        self.step = step
        self.meta = meta
        self.quarantine = quarantine
        self._frame = frame if isinstance(frame, pl.DataFrame) else None
        self._rows = frame if isinstance(frame, RankRows) else None

    @property
    def frame(self) -> pl.DataFrame:
        if self._frame is None:
            assert self._rows is not None
            self._frame = self._rows.rows(0, self._rows.scalars.height)
            self._rows = None
        return self._frame

    def ranks(self) -> pl.Series:
        """The `rank` column, in write order."""
        scalars = self._rows.scalars if self._rows is not None else self.frame
        return scalars.get_column(c.RANK)

    def rows(self, start: int, length: int) -> pl.DataFrame:
        """Rows [start, start + length) of `frame`, without gathering the others."""
        if self._rows is not None:
            return self._rows.rows(start, length)
        return _compact(self.frame, start, length)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.frame.write_parquet(folder / "batch.parquet", **STAGING_PARQUET)
        if self.quarantine is not None:
            self.quarantine.write_parquet(folder / writer.QUARANTINE, **STAGING_PARQUET)
        (folder / "meta.json").write_text(json.dumps(self.meta))

    @classmethod
    def load(cls, folder: Path) -> TrainBatch:
        meta = json.loads((folder / "meta.json").read_text())
        quarantine = folder / writer.QUARANTINE
        return cls(
            step=meta["step"],
            frame=pl.read_parquet(folder / "batch.parquet"),
            meta=meta,
            quarantine=pl.read_parquet(quarantine) if quarantine.exists() else None,
        )


def _light(frame: pl.DataFrame, settings: Settings, step: int) -> pl.DataFrame:
    return s.light_columns(frame.lazy(), settings.reward_key, step).collect()


def quarantine_table(loaded: pl.DataFrame, failing: pl.DataFrame) -> pl.DataFrame:
    """Every row of each trajectory holding a failing row, as loaded (before any repair),
    in batch order, with a `reason`: the failing row's rules, or for its siblings
    "sibling of an invalid leaf: " and the rules their trajectory broke."""
    own = failing.group_by(ROW_ID, maintain_order=True).agg(
        pl.col(REASON).unique(maintain_order=True).str.join("; ")
    )
    trajectory = (
        failing.join(loaded.select(ROW_ID, *TRAJECTORY), on=ROW_ID, maintain_order="left")
        .group_by(*TRAJECTORY, maintain_order=True)
        .agg(pl.col(REASON).unique(maintain_order=True).str.join("; ").alias("_trajectory"))
    )
    touched = pl.col(ROW_ID).is_in(failing.get_column(ROW_ID).implode()).any().over(TRAJECTORY)
    return (
        loaded.filter(touched)
        .join(own, on=ROW_ID, how="left", maintain_order="left")
        .join(trajectory, on=list(TRAJECTORY), how="left", nulls_equal=True, maintain_order="left")
        .with_columns(pl.coalesce(REASON, pl.lit(SIBLING) + pl.col("_trajectory")).alias(REASON))
        .drop(ROW_ID, PATH_STEP, "_trajectory")
        .rename(QUARANTINE_PROVENANCE)
        .select(
            pl.exclude(*QUARANTINE_PROVENANCE.values(), REASON),
            *QUARANTINE_PROVENANCE.values(),
            REASON,
        )
    )


def load_samples(step: int, sources: Sequence[SourceFile], settings: Settings) -> SampleTable:
    """Read a step, repair legacy ids if asked, validate. With `on_invalid: fail` any broken
    rule fails the step; with `quarantine` the trajectories holding a failing row are set
    aside whole and the rest goes on. Problems that name no rows (an unreadable file, a
    missing column, a column of an impossible type, a struct reward without reward_key)
    fail the step in both modes: there is nothing to set aside and nothing to count."""
    # Polars reads without the GIL: Pandera's import and set-up run meanwhile.
    with ThreadPoolExecutor(max_workers=1) as pool:
        models = pool.submit(load_models)
        loaded = load_step(step, sources)
        models.result()
    original = loaded.frame.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(ROW_ID))
    type_errors = loaded.type_errors
    if type_errors is None:
        type_errors = pl.repeat(None, original.height, dtype=pl.String, eager=True)
    frame = original.with_columns(type_errors.alias(TYPE_ERROR))
    repaired = {CLEARED: 0, STAMPED: 0}
    if settings.rollout_id_policy == "repair":
        frame, repaired = repair_rollout_ids(frame)
    quarantining = settings.on_invalid == "quarantine"
    verdict = validate_step(
        frame,
        loaded.type_violations,
        step,
        settings.reward_key,
        settings.normalizes_rewards,
        until_valid=quarantining,
    )
    if verdict.violations and not (quarantining and verdict.settled):
        raise StepError(verdict.violations)
    quarantine = None
    if verdict.violations:
        quarantine = quarantine_table(original, verdict.failing)
    return SampleTable(
        step=step,
        frame=verdict.valid.drop(ROW_ID, TYPE_ERROR),
        inputs=loaded.inputs,
        ignored_columns=loaded.ignored_columns,
        ingested=loaded.frame.height,
        repaired=repaired,
        quarantine=quarantine,
    )


def _rank_rows(
    head: pl.DataFrame, light: pl.DataFrame, layout: Layout, optional: list[str]
) -> RankRows:
    """The scalar shard columns in write order. The list columns are left in batch order,
    to be gathered once, rank by rank, as they are written."""
    micro_batch = (
        pl.Series(c.MICRO_BATCH, layout.micro_batch, dtype=pl.Int32)
        if layout.micro_batch is not None
        else pl.repeat(None, len(layout.order), dtype=pl.Int32, eager=True).alias(c.MICRO_BATCH)
    )
    scalars = light.select(
        c.BATCH_POSITION,
        c.RESPONSE_LENGTHS,
        c.TOTAL_LENGTHS,
        c.REWARDS,
        c.RAW_REWARD,
        c.TRUNCATED,
        c.SAMPLE_INDICES,
        c.ROLLOUT_IDS,
        c.ROLLOUT_MASK_SUMS,
    )[pl.Series(layout.order)].with_columns(
        pl.Series(c.TRAIN_STEP, layout.train_step, dtype=pl.Int32),
        micro_batch,
        pl.Series(c.RANK, layout.rank, dtype=pl.Int32),
    )
    needed = [c.TOKENS, c.LOSS_MASK, c.RESPONSE_LENGTH, c.REMOVE_SAMPLE, *optional]
    inputs = head.select(name for name in needed if name in head.columns)
    return RankRows(scalars=scalars, inputs=inputs, optional=optional, order=layout.order)


def plan_batch(samples: SampleTable, settings: Settings) -> TrainBatch:
    """Trim, compute every shard column and the layout; the batch in write order."""
    step, frame = samples.step, samples.frame
    light = _light(frame, settings, step).lazy()
    compact = is_compact(light)
    try:
        trim = plan_trim(frame.height, settings, compact, step)
    except StepError as error:
        if samples.quarantine is not None:
            for violation in error.violations:
                violation.message += (
                    f" (left after quarantining {samples.quarantine.height} rows of invalid "
                    "trajectories; `rollout-shards validate` with on_invalid fail lists why)"
                )
        raise
    head = frame.head(trim.kept)
    light = light_shard_columns(light.head(trim.kept)).with_columns(raw_reward(frame.schema))
    light, equal_groups = with_rewards(light, trim.kept, settings)
    light_df = light.collect()
    effective = settings.model_copy(update={"global_batch_size": trim.global_batch_size})
    layout = batch_layout(light_df, effective, compact)
    optional = optional_columns(head)
    rows = _rank_rows(head, light_df, layout, optional)
    quarantined = samples.quarantine.height if samples.quarantine is not None else 0
    counts = {
        "ingested": samples.ingested,
        "quarantined": quarantined,
        "repaired": sum(samples.repaired.values()),
        "trimmed": trim.trimmed,
        "dropped": len(layout.dropped),
        "written": len(layout.order),
    }
    meta = {
        "step": step,
        "settings": settings.model_dump(mode="json"),
        "inputs": samples.inputs,
        "counts": counts,
        "repaired": samples.repaired,
        "is_compact": compact,
        "global_batch_size": trim.global_batch_size,
        "dynamic_global_batch_size": trim.dynamic_global_batch_size,
        "num_train_steps": len(layout.num_rollouts),
        "num_rollouts": layout.num_rollouts,
        "num_microbatches": layout.num_microbatches,
        "equal_reward_groups": equal_groups,
        "ignored_columns": samples.ignored_columns,
    }
    return TrainBatch(step=step, frame=rows, meta=meta, quarantine=samples.quarantine)


def write_shards(batch: TrainBatch, out_root: Path) -> dict[str, Any]:
    """Write every rank file, the quarantine and the manifest, then commit the step folder."""
    dp = batch.meta["settings"]["dp_size"]
    writer.clean_stale(out_root)
    staged = writer.staging_folder(out_root, batch.step)
    try:
        ranks = batch.ranks().to_numpy()
        bounds = np.searchsorted(ranks, np.arange(dp + 1), side="left")

        def write_rank(rank: int) -> dict[str, Any]:
            part = batch.rows(int(bounds[rank]), int(bounds[rank + 1] - bounds[rank]))
            name = writer.rank_file(rank)
            writer.write_parquet(part.drop(c.RANK), staged / name)
            tokens = int(part.get_column(c.TOTAL_LENGTHS).sum())
            return writer.file_record(staged / name, name, part.height, tokens)

        # Polars gathers and encodes, and hashlib hashes, without the GIL: two ranks at a
        # time keep two cores busy where one small file leaves one idle. A file's bytes do
        # not depend on the threads.
        with ThreadPoolExecutor(max_workers=RANK_WRITERS) as pool:
            outputs = list(pool.map(write_rank, range(dp)))
        if batch.quarantine is not None and batch.quarantine.height:
            quarantine = batch.quarantine
            writer.write_parquet(quarantine, staged / writer.QUARANTINE)
            outputs.append(
                writer.file_record(staged / writer.QUARANTINE, writer.QUARANTINE, quarantine.height)
            )
        manifest = {**batch.meta, "outputs": outputs}
        writer.write_manifest(manifest, staged / writer.MANIFEST)
        writer.commit_folder(staged, writer.step_folder(out_root, batch.step))
    except BaseException:
        import shutil

        shutil.rmtree(staged, ignore_errors=True)
        raise
    return manifest


def current_manifest(
    step: int, sources: Sequence[SourceFile], settings: Settings, out_root: Path
) -> dict[str, Any] | None:
    """The manifest of a complete step folder built from these very inputs (same paths,
    same sha256, same order) with these settings, whose files are all there unchanged;
    None when the step must be built."""
    manifest = read_manifest(out_root, step)
    if manifest is None:  # a first build: no need to hash the inputs here
        return None
    checksums = [sha256_of(source.path) for source in sources]
    if not shards_are_current(manifest, checksums, settings):
        return None
    paths = [record.get("path") for record in manifest.get("inputs", [])]
    if paths != [str(source.path) for source in sources]:
        return None
    folder = writer.step_folder(out_root, step)
    for output in manifest.get("outputs", []):
        path = folder / output["path"]
        if not path.is_file() or sha256_of(path) != output["sha256"]:
            return None
    return manifest


class StageReporter(Protocol):
    """Told when each stage of a step starts and ends (the CLI's progress)."""

    def begin(self, step: int, stage: str) -> None: ...

    def end(self, step: int, stage: str, detail: str) -> None: ...


class _Silent:
    def begin(self, step: int, stage: str) -> None:
        pass

    def end(self, step: int, stage: str, detail: str) -> None:
        pass


def build_step(
    step: int,
    sources: Sequence[SourceFile],
    settings: Settings,
    out_root: Path,
    force: bool = False,
    reporter: StageReporter | None = None,
) -> dict[str, Any]:
    """The whole build of one step; returns its manifest. A step folder that is current
    (`current_manifest`) is kept as it is unless `force`; any other is replaced whole."""
    if not force and (manifest := current_manifest(step, sources, settings, out_root)):
        return manifest
    report = reporter or _Silent()
    report.begin(step, "read and validate")
    samples = load_samples(step, sources, settings)
    report.end(step, "read and validate", f"{samples.ingested} rows read")
    report.begin(step, "plan")
    batch = plan_batch(samples, settings)
    report.end(step, "plan", f"{batch.meta['counts']['written']} rows to write")
    report.begin(step, "write")
    manifest = write_shards(batch, out_root)
    report.end(step, "write", f"{len(manifest['outputs'])} files")
    return manifest


# Staging and freshness for the Dagster layer: the `rollout_samples` asset is stored as
# Parquet between runs, and sensors and schedules ask whether a step folder is current.


def save_sample_table(samples: SampleTable, folder: Path) -> None:
    """Write a SampleTable as Parquet plus a small JSON of its bookkeeping."""
    folder.mkdir(parents=True, exist_ok=True)
    samples.frame.write_parquet(folder / "samples.parquet", **STAGING_PARQUET)
    if samples.quarantine is not None:
        samples.quarantine.write_parquet(folder / writer.QUARANTINE, **STAGING_PARQUET)
    meta = {
        "step": samples.step,
        "inputs": samples.inputs,
        "ignored_columns": samples.ignored_columns,
        "ingested": samples.ingested,
        "repaired": samples.repaired,
    }
    (folder / "meta.json").write_text(json.dumps(meta))


def load_sample_table(folder: Path) -> SampleTable:
    """Read a SampleTable written by `save_sample_table`."""
    meta = json.loads((folder / "meta.json").read_text())
    quarantine = folder / writer.QUARANTINE
    return SampleTable(
        step=meta["step"],
        frame=pl.read_parquet(folder / "samples.parquet"),
        inputs=meta["inputs"],
        ignored_columns=meta["ignored_columns"],
        ingested=meta["ingested"],
        repaired=meta["repaired"],
        quarantine=pl.read_parquet(quarantine) if quarantine.exists() else None,
    )


def read_manifest(out_root: Path, step: int) -> dict[str, Any] | None:
    """A committed step's manifest, or None when the step folder is absent or incomplete."""
    path = writer.step_folder(out_root, step) / writer.MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summary_line(manifest: dict[str, Any], folder: Path) -> str:
    """One line per built step, as the CLI and `make run` print it."""
    n = manifest["counts"]
    kind = "compact" if manifest["is_compact"] else "not compact"
    return (
        f"step {manifest['step']}: {n['ingested']} rows in, {n['quarantined']} quarantined, "
        f"{n['trimmed']} trimmed, {n['dropped']} dropped, {n['written']} written to "
        f"{manifest['settings']['dp_size']} ranks, {manifest['num_train_steps']} train steps, "
        f"{kind} -> {folder}"
    )


def shards_are_current(
    manifest: dict[str, Any] | None, input_sha256: Sequence[str], settings: Settings
) -> bool:
    """True when a step was written from files with these checksums, in this batch order,
    and with these settings: building it again would give the same shards."""
    if manifest is None:
        return False
    written_from = [record["sha256"] for record in manifest.get("inputs", [])]
    same_inputs = written_from == list(input_sha256)
    return same_inputs and manifest.get("settings") == settings.model_dump(mode="json")
