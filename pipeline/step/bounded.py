"""A step built with its per-token lists held one part, or one rank, at a time.

The in-memory build (`ingest`, `plan`, `write`) holds the whole step; nearly all of its bytes
are the lists with a value per token (`c.PER_TOKEN_COLUMNS`), which only the writer needs
whole, and only one rank at a time. Here:

1. read: each input file comes in parts (`io.load.read_in_parts`); a part is typed, its lists
   pass the contract's column tests and are reduced to the per-row scalars the rules, the
   plan and the metrics read (`samples.reduced_lists`), then go to an uncompressed Arrow file
   in a private folder of the output root (`Spill`); the rest of each row stays in memory;
2. validate and plan the rows without their lists, as the in-memory build does;
3. route: each spilled part's lists go to the spill files of their ranks, in batch order;
4. write: `write_shards` asks for each rank's rows; `SpilledRows` gathers that rank's lists
   from its files into training order, one frame per rank file as the in-memory build
   writes it, so the files are byte-identical.

A step that breaks any rule, or that this path cannot read, raises `Unbounded`, and the
in-memory build takes it whole: that build reports a bad step exactly (its line, its
quarantine), so this one need only be right for valid steps.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import polars as pl

from pipeline import columns as c
from pipeline.columns import ROW_ID, TYPE_ERROR
from pipeline.io import writer
from pipeline.io.arrow_types import panics_kept_off_stderr
from pipeline.io.background import EarlyDigests
from pipeline.io.discovery import SourceFile
from pipeline.io.load import StepFiles, read_in_parts
from pipeline.schemas.rules import TABLE_LISTS, TABLE_ROWS
from pipeline.schemas.validate import passes, validate_step
from pipeline.settings import RowSettings, Settings
from pipeline.step.ingest import quarantine_table
from pipeline.step.tables import RankRows, SampleTable, TrainBatch, compact
from pipeline.transforms import samples as s
from pipeline.transforms.repair import CLEARED, STAMPED, repair_rollout_ids
from pipeline.transforms.shard_columns import loss_masks, optional_shard_columns

# Decoded bytes of one part of an input file: what the read holds at once beside the
# rows without their lists.
PART_BYTES = 16 << 20
# Steps whose input files take more bytes on disk than this are built here by default;
# smaller ones fit in memory, where the build skips the spill's writes and reads.
STREAM_ABOVE = 256 << 20

_POSITION = "_batch_position"


class Unbounded(Exception):
    """The step is for the in-memory build: this build cannot vouch for it (why)."""


def input_bytes(sources: Sequence[SourceFile]) -> int:
    """The bytes of the step's input files on disk (a file that cannot be read counts 0:
    the in-memory build reports it)."""
    total = 0
    for source in sources:
        try:
            total += os.stat(source.path).st_size
        except OSError:
            pass
    return total


class Spill:
    """A private folder of the output root holding one build's lists until they are written
    (`writer.private_name`: a killed build's folder is removed by the next build)."""

    def __init__(self, out_root: Path, step: int) -> None:
        out_root.mkdir(parents=True, exist_ok=True)
        self.folder = out_root / writer.private_name("tmp", f"spill-step={step}")
        self.folder.mkdir()
        self.parts: list[tuple[Path, int]] = []  # each part's file and rows, in load order
        self.schema: dict[str, pl.DataType] = {}  # every list column any part has
        # The loaded position of each row of the batch, in batch order; None: every row.
        self.kept: pl.Series | None = None

    def __enter__(self) -> Spill:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def add(self, lists: pl.DataFrame) -> None:
        path = self.folder / f"part={len(self.parts)}.arrow"
        lists.write_ipc(path, compression="uncompressed")
        self.parts.append((path, lists.height))
        for name, dtype in lists.schema.items():
            self.schema.setdefault(name, dtype)

    def rows(self, positions: pl.Series) -> pl.DataFrame:
        """The lists of the rows at these loaded positions (ascending), read from the parts."""
        first, taken = 0, []
        for index, (_, height) in enumerate(self.parts):
            mine = positions.filter((positions >= first) & (positions < first + height))
            if mine.len():
                taken.append(self.part(index)[mine - first])
            first += height
        return pl.concat(taken) if taken else pl.DataFrame(schema=self.schema)

    def part(self, index: int) -> pl.DataFrame:
        """Spilled part `index` with every list column (nulls where its file had none)."""
        path, _ = self.parts[index]
        frame = pl.read_ipc(path)
        return frame.select(
            pl.col(name) if name in frame.columns else pl.lit(None, dtype=dtype).alias(name)
            for name, dtype in self.schema.items()
        )


def load_samples(
    step: int,
    sources: Sequence[SourceFile],
    settings: Settings | RowSettings,
    spill: Spill,
    part_bytes: int | None = None,
    early: EarlyDigests | None = None,
) -> SampleTable:
    """`ingest.load_samples` for a valid step, its lists spilled part by part (of
    `part_bytes`, by default `PART_BYTES`); `Unbounded` for any step that breaks a rule."""
    part_bytes = part_bytes or PART_BYTES
    files, order = StepFiles(step), {}
    for source in sources:
        rows = 0

        def take(frame: pl.DataFrame, first: int, source: SourceFile = source) -> None:
            nonlocal rows
            typed = files.add_rows(source, frame, first)
            if files.type_violations or typed.get_column(TYPE_ERROR).is_not_null().any():
                raise Unbounded("a value is not of its contract type")
            lists = [name for name in c.PER_TOKEN_COLUMNS if name in typed.columns]
            if passes(TABLE_LISTS, typed.select(lists)) is not True:
                raise Unbounded("a list column fails its column tests")
            order.update(dict.fromkeys(typed.columns))
            spill.add(typed.select(lists))
            files.frames.append(typed.drop(lists).hstack(s.reduced_lists(typed)))
            rows += typed.height

        taken = early(source.path) if early is not None else None
        files.add_file(source, read_in_parts(source, step, part_bytes, take, taken), rows)
    loaded = files.loaded()
    original = loaded.frame.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(ROW_ID))
    # the loaded columns in the in-memory build's order: the files' (lists in place), then
    # the ones the load fills in
    reduced = set(s.list_reductions(original.schema)) | {
        c.has_column(n) for n in c.PER_TOKEN_COLUMNS
    }
    order.update(dict.fromkeys(n for n in original.columns if n not in reduced))
    frame = original.with_columns(pl.lit(None, dtype=pl.String).alias(TYPE_ERROR))
    repaired = {CLEARED: 0, STAMPED: 0}
    if settings.rollout_id_policy == "repair":
        frame, repaired = repair_rollout_ids(frame)
    quarantining = settings.on_invalid == "quarantine"
    verdict = validate_step(
        frame,
        [],
        step,
        settings.reward_key,
        settings.normalizes_rewards,
        until_valid=quarantining,
        table=TABLE_ROWS,
    )
    if verdict.violations and not (quarantining and verdict.settled):
        raise Unbounded("a rule fails")
    quarantine = None
    if verdict.violations:
        quarantine = _quarantine(original, verdict.failing, spill, list(order))
        spill.kept = verdict.valid.get_column(ROW_ID)
    return SampleTable(
        step=step,
        frame=verdict.valid.drop(ROW_ID, TYPE_ERROR),
        files=loaded.files,
        ignored_columns=loaded.ignored_columns,
        ingested=original.height,
        repaired=repaired,
        quarantine=quarantine,
        light=verdict.light,
        columns=pl.Schema(
            (name, spill.schema[name] if name in spill.schema else original.schema[name])
            for name in order
            if name not in (ROW_ID, TYPE_ERROR)
        ),
    )


def samples_or_none(
    step: int,
    sources: Sequence[SourceFile],
    settings: Settings | RowSettings,
    spill: Spill,
    early: EarlyDigests | None = None,
) -> SampleTable | None:
    """`load_samples`, or None when the in-memory build must take the step: it reads the
    step again and reports whatever this read could not vouch for."""
    with panics_kept_off_stderr() as panicked:
        try:
            return load_samples(step, sources, settings, spill, early=early)
        except pl.exceptions.PanicException:  # a BaseException: it would end the run
            panicked[0] = True
        except Exception:  # noqa: BLE001 - the in-memory build says why
            pass
    return None


def _quarantine(
    original: pl.DataFrame, failing: pl.DataFrame, spill: Spill, order: list[str]
) -> pl.DataFrame:
    """`ingest.quarantine_table` of the trajectories holding a failing row, their lists
    read back from the spill: only those rows are ever whole in memory."""
    ids = failing.get_column(ROW_ID).implode()
    touched = original.filter(pl.col(ROW_ID).is_in(ids).any().over(c.TRAJECTORY))
    lists = spill.rows(touched.get_column(ROW_ID))
    whole = touched.hstack(lists).select(
        name for name in order if name in touched.columns or name in lists.columns
    )
    return quarantine_table(whole, failing)


def route(batch: TrainBatch, spill: Spill) -> TrainBatch:
    """The planned batch with its lists routed from the spilled parts to one spill file per
    rank and part, each holding the rank's rows of the part in batch order."""
    rows = batch.rank_rows
    assert rows is not None, "a planned batch holds its rows in batch order"
    total = sum(height for _, height in spill.parts)
    # by loaded position: each row's rank (-1: not written) and batch position
    kept = spill.kept if spill.kept is not None else pl.int_range(total, eager=True)
    rank_of = pl.repeat(-1, total, dtype=pl.Int32, eager=True).scatter(
        kept.gather(rows.order), rows.scalars.get_column(c.RANK)
    )
    position_of = pl.repeat(-1, total, dtype=pl.Int64, eager=True).scatter(
        kept, pl.int_range(kept.len(), dtype=pl.Int64, eager=True)
    )
    files: dict[int, list[Path]] = {rank: [] for rank in range(batch.meta.dp_size)}
    first = 0
    for index, (path, height) in enumerate(spill.parts):
        ranks = rank_of.slice(first, height)
        part = spill.part(index).with_columns(position_of.slice(first, height).alias(_POSITION))
        for rank, names in files.items():
            mine = part.filter(ranks == rank)
            if mine.height:
                names.append(spill.folder / f"rank={rank}-part={index}.arrow")
                mine.write_ipc(names[-1], compression="uncompressed")
        path.unlink()
        first += height
    spilled = SpilledRows(rows, files, {**spill.schema, _POSITION: pl.Int64()})
    return TrainBatch(batch.step, spilled, batch.meta, batch.quarantine)


class SpilledRows(RankRows):
    """`RankRows` whose lists wait in spill files, one set per rank; the writer takes one
    rank at a time, so that the build holds one rank's lists."""

    parallel_ranks = 1

    def __init__(
        self, rows: RankRows, files: dict[int, list[Path]], schema: dict[str, pl.DataType]
    ) -> None:
        super().__init__(rows.scalars, rows.inputs, rows.optional, rows.order)
        self.files = files
        self.schema = schema

    def rows(self, start: int, length: int) -> pl.DataFrame:
        positions = self.order.slice(start, length)
        ranks = self.scalars.get_column(c.RANK).slice(start, length).unique().sort()
        parts = [pl.read_ipc(path) for r in ranks for path in self.files[r]]
        held = pl.concat(parts) if parts else pl.DataFrame(schema=self.schema)
        del parts
        where = (
            positions.to_frame(_POSITION)
            .join(
                held.select(_POSITION, pl.int_range(pl.len(), dtype=pl.Int64).alias("_i")),
                on=_POSITION,
                how="left",
                maintain_order="left",
            )
            .get_column("_i")
            .rechunk()  # a gather gives a chunk per chunk of its indices
        )
        # column by column, each spilled column freed once gathered: the rank's lists are
        # held about once, not twice
        held = held.drop(_POSITION)
        lists = []
        for name in list(held.columns):
            lists.append(held.get_column(name).gather(where))
            held = held.drop(name)
        picked = self.inputs[positions].hstack(lists)
        written = picked.select(
            pl.col(c.TOKENS), loss_masks(picked), *optional_shard_columns(self.optional)
        )
        return compact(self.scalars, start, length).hstack(written).select(*c.DATASET_COLUMNS)
