"""A step built with its per-token lists held one part, or one rank, at a time.

The in-memory build (`ingest`, `plan`, `write`) holds the whole step; nearly all of its bytes
are the lists with a value per token (`c.PER_TOKEN_COLUMNS`), which only the writer needs
whole, and only one rank at a time. Here:

1. read: each input file comes in parts (`io.load.read_in_parts`); a part is typed, its lists
   pass the contract's column tests and are reduced to the per-row scalars the rules, the
   plan and the metrics read (`samples.reduced_lists`), then go to an uncompressed Arrow file
   in a private folder of the output root (`Spill`); the rest of each row stays in memory;
2. validate and plan the rows without their lists, as the in-memory build does (the
   trajectories a quarantine sets aside take their lists back from the spill);
3. write: `write_shards` asks for each rank's rows; `SpilledRows` takes that rank's lists
   from each spilled part, mapped, reading only their pages (`take_rows`), and gathers them
   into training order, one frame per rank file as the in-memory build writes it, so the
   files are byte-identical.

The driver (`step.build`) chooses this read up front, from the size of the step's input
files (the `stream_above` setting), and never reads a step twice: a step whose values or
lists break a column's type or tests is taken back whole from its spill and checked as the
in-memory read checks it, so a bad step gets the same lines and quarantine either way.
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
from pipeline.errors import StepError
from pipeline.io import writer
from pipeline.io.discovery import SourceFile
from pipeline.io.load import read_in_parts
from pipeline.io.step_files import LoadedStep, StepFiles
from pipeline.schemas.rules import TABLE_LISTS, TABLE_ROWS
from pipeline.schemas.validate import passes
from pipeline.settings import RowSettings, Settings
from pipeline.speed import EarlyDigests
from pipeline.step.ingest import checked, quarantine_table, repair_and_validate
from pipeline.step.tables import RankRows, SampleTable, TrainBatch, compact
from pipeline.transforms import samples as s
from pipeline.transforms.shard_columns import loss_masks, optional_shard_columns

# Decoded bytes of one part of an input file: what the read holds at once beside the
# rows without their lists.
PART_BYTES = 16 << 20


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
        # each part's file, first loaded position and rows, in load order
        self.parts: list[tuple[Path, int, int]] = []
        self.rows = 0  # rows spilled so far
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
        self.parts.append((path, self.rows, lists.height))
        self.rows += lists.height
        for name, dtype in lists.schema.items():
            self.schema.setdefault(name, dtype)


def load_samples(
    step: int,
    sources: Sequence[SourceFile],
    settings: Settings | RowSettings,
    spill: Spill,
    part_bytes: int | None = None,
    early: EarlyDigests | None = None,
) -> SampleTable:
    """`ingest.load_samples` with the lists spilled part by part (of `part_bytes`, by default
    `PART_BYTES`). A step whose values or lists break a column's type or tests is taken
    back whole from its spill and checked as the in-memory read checks it (its lines and
    quarantine are that read's); any other step is checked without its lists."""
    part_bytes = part_bytes or PART_BYTES
    files, order = StepFiles(step), {}
    # each part's columns as typed, lists in place: a step taken back whole is these
    part_columns: list[list[str]] = []
    whole = False  # some part breaks a column's type or tests

    for source in sources:
        rows = 0

        def take(frame: pl.DataFrame, first: int, source: SourceFile = source) -> None:
            nonlocal rows, whole
            typed = files.add_rows(source, frame, first)
            lists = [name for name in c.PER_TOKEN_COLUMNS if name in typed.columns]
            whole = whole or bool(
                files.type_violations
                or typed.get_column(TYPE_ERROR).is_not_null().any()
                or passes(TABLE_LISTS, typed.select(lists)) is not True
            )
            order.update(dict.fromkeys(typed.columns))
            part_columns.append(typed.columns)
            spill.add(typed.select(lists))
            files.frames.append(typed.drop(lists).hstack(s.reduced_lists(typed)))
            rows += typed.height

        taken = early(source.path) if early is not None else None
        sha256 = read_in_parts(source, step, part_bytes, take, taken)
        assert sha256 is not None, "a whole file is hashed"
        files.add_file(source, sha256, rows)
    if whole:
        return checked(_taken_back(files, part_columns, spill), settings)
    loaded = files.loaded()
    original = loaded.frame.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(ROW_ID))
    # the loaded columns in the in-memory build's order: the files' (lists in place), then
    # the ones the load fills in
    reduced = set(s.list_reductions(original.schema)) | {
        c.has_column(n) for n in c.PER_TOKEN_COLUMNS
    }
    order.update(dict.fromkeys(n for n in original.columns if n not in reduced))
    frame = original.with_columns(pl.lit(None, dtype=pl.String).alias(TYPE_ERROR))
    verdict, repaired = repair_and_validate(frame, [], step, settings, TABLE_ROWS)
    quarantining = settings.on_invalid == "quarantine"
    if verdict.violations and not (quarantining and verdict.settled):
        # the lists passed their tests, so what fails is the rows' rules, found on the same
        # rows as the in-memory read finds them
        raise StepError(verdict.violations)
    quarantine = None
    if not verdict.failing.is_empty():  # invalid trajectories, or stale groups
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


def _taken_back(files: StepFiles, part_columns: list[list[str]], spill: Spill) -> LoadedStep:
    """The step as the in-memory read loads it: each part's rows with their lists back
    from the spill, in the columns it was typed with. Only a step that breaks a column's
    type or tests comes here, to be reported (or quarantined) exactly."""
    frames = []
    parts = zip(files.frames, part_columns, spill.parts, strict=True)
    for reduced, columns, (path, _, _) in parts:
        lists = pl.read_ipc(path)
        frames.append(reduced.hstack(lists).select(columns))
    files.frames = frames
    return files.loaded()


def _quarantine(
    original: pl.DataFrame, failing: pl.DataFrame, spill: Spill, order: list[str]
) -> pl.DataFrame:
    """`ingest.quarantine_table` of the trajectories holding a failing row, their lists
    read back from the spill: only those rows are ever whole in memory."""
    ids = failing.get_column(ROW_ID).implode()
    touched = original.filter(pl.col(ROW_ID).is_in(ids).any().over(c.TRAJECTORY))
    lists = take_rows(spill.parts, spill.schema, touched.get_column(ROW_ID))
    whole = touched.hstack(lists).select(
        name for name in order if name in touched.columns or name in lists.columns
    )
    return quarantine_table(whole, failing)


def take_rows(
    parts: list[tuple[Path, int, int]], schema: dict[str, pl.DataType], wanted: pl.Series
) -> pl.DataFrame:
    """The lists of the rows at these loaded positions (ascending), in that order, from the
    spilled `parts` (file, first loaded position, rows). Each part is mapped
    (`pyarrow.memory_map`) and only the wanted rows' pages are read; a part is unmapped
    before the next, so no more than one part's pages are resident besides the rows."""
    import pyarrow as pa
    import pyarrow.ipc

    taken = []
    for path, first, height in parts:
        local = wanted.filter((wanted >= first) & (wanted < first + height)) - first
        if local.is_empty():
            continue
        with pa.memory_map(str(path)) as source:
            # Polars takes the mapped buffers as they are and gathers the rows into its own
            mapped = pl.from_arrow(pyarrow.ipc.open_file(source).read_all())
            assert isinstance(mapped, pl.DataFrame)
            frame = mapped[local]
            del mapped
        taken.append(
            frame.select(
                pl.col(n) if n in frame.columns else pl.lit(None, dtype=d).alias(n)
                for n, d in schema.items()
            )
        )
    return pl.concat(taken) if taken else pl.DataFrame(schema=schema)


def spilled(batch: TrainBatch, spill: Spill) -> TrainBatch:
    """The planned batch with its lists left in the spilled parts, where each rank's writer
    gathers its own rows (`SpilledRows`)."""
    rows = batch.rank_rows
    assert rows is not None, "a planned batch holds its rows in batch order"
    # the loaded position of each batch position
    loaded = spill.kept if spill.kept is not None else pl.int_range(spill.rows, eager=True)
    rank_rows = SpilledRows(rows, spill.parts, loaded, spill.schema)
    return TrainBatch(batch.step, rank_rows, batch.meta, batch.quarantine)


class SpilledRows(RankRows):
    """`RankRows` whose lists wait in the spilled parts (`take_rows`); the writer takes one
    rank at a time, so that the build holds one rank's lists."""

    parallel_ranks = 1

    def __init__(
        self,
        rows: RankRows,
        parts: list[tuple[Path, int, int]],
        loaded: pl.Series,
        schema: dict[str, pl.DataType],
    ) -> None:
        super().__init__(rows.scalars, rows.inputs, rows.optional, rows.order, rows.columns)
        self.parts = parts  # each part's file, first loaded position and rows
        self.loaded = loaded  # the loaded position of each batch position
        self.schema = schema  # every list column any part has

    def for_rank(self, start: int, length: int) -> RankRows:
        """Rows [start, start + length) alone; their lists stay in the spilled parts, where
        they are found by batch position, so every position's light inputs are kept."""
        mine = RankRows(
            compact(self.scalars, start, length),
            self.inputs,
            self.optional,
            self.order.slice(start, length),
            self.columns,
        )
        return SpilledRows(mine, self.parts, self.loaded, self.schema)

    def rows(self, start: int, length: int) -> pl.DataFrame:
        positions = self.order.slice(start, length)
        loaded = self.loaded.gather(positions)
        wanted = loaded.sort()
        held = take_rows(self.parts, self.schema, wanted)
        # a gather gives a chunk per chunk of its indices: one, as the in-memory build's
        where = wanted.search_sorted(loaded).rechunk()
        # column by column, each taken column freed once gathered: the rank's lists are
        # held about once, not twice
        lists = []
        for name in list(held.columns):
            lists.append(held.get_column(name).gather(where))
            held = held.drop(name)
        picked = self.inputs[positions].hstack(lists)
        written = picked.select(
            pl.col(c.TOKENS), loss_masks(picked), *optional_shard_columns(self.optional)
        )
        return compact(self.scalars, start, length).hstack(written).select(*self.columns)
