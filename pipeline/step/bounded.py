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
from pipeline.columns import TYPE_ERROR
from pipeline.io import writer
from pipeline.io.discovery import SourceFile
from pipeline.io.load import StepFiles, read_in_parts
from pipeline.schemas.rules import TABLE, Model
from pipeline.schemas.validate import check_rules, passes
from pipeline.settings import RowSettings, Settings
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
# The contract's column tests, split: those of the lists run on each part as it is read,
# the others on the step's rows without their lists.
_LIST_TESTS = Model(
    TABLE.name, columns={n: r for n, r in TABLE.columns.items() if n in c.PER_TOKEN_COLUMNS}
)
_ROW_TESTS = Model(
    TABLE.name, columns={n: r for n, r in TABLE.columns.items() if n not in c.PER_TOKEN_COLUMNS}
)


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
        self.parts: list[tuple[Path, int]] = []  # each part's file and rows, in batch order
        self.schema: dict[str, pl.DataType] = {}  # every list column any part has

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
) -> SampleTable:
    """`ingest.load_samples` for a valid step, its lists spilled part by part (of
    `part_bytes`, by default `PART_BYTES`); `Unbounded` for any step that breaks a rule."""
    part_bytes = part_bytes or PART_BYTES
    files = StepFiles(step)
    for source in sources:
        rows = 0

        def take(frame: pl.DataFrame, first: int, source: SourceFile = source) -> None:
            nonlocal rows
            typed = files.add_rows(source, frame, first)
            if files.type_violations or typed.get_column(TYPE_ERROR).is_not_null().any():
                raise Unbounded("a value is not of its contract type")
            lists = [name for name in c.PER_TOKEN_COLUMNS if name in typed.columns]
            if passes(_LIST_TESTS, typed.select(lists)) is not True:
                raise Unbounded("a list column fails its column tests")
            spill.add(typed.select(lists))
            files.frames.append(typed.drop(lists).hstack(s.reduced_lists(typed)))
            rows += typed.height

        files.add_file(source, read_in_parts(source, step, part_bytes, take), rows)
    loaded = files.loaded()
    frame, repaired = loaded.frame, {CLEARED: 0, STAMPED: 0}
    if settings.rollout_id_policy == "repair":
        frame, repaired = repair_rollout_ids(frame)
    if passes(_ROW_TESTS, frame.drop(c.REWARD)) is not True:
        raise Unbounded("a column fails its column tests")
    light = s.light_frame(frame, settings.reward_key, step)
    if check_rules(light, step, settings.normalizes_rewards):
        raise Unbounded("a row rule fails")
    return SampleTable(
        step=step,
        frame=frame,
        files=loaded.files,
        ignored_columns=loaded.ignored_columns,
        ingested=frame.height,
        repaired=repaired,
        light=light,
    )


def route(batch: TrainBatch, spill: Spill) -> TrainBatch:
    """The planned batch with its lists routed from the spilled parts to one spill file per
    rank and part, each holding the rank's rows of the part in batch order."""
    rows = batch.rank_rows
    assert rows is not None, "a planned batch holds its rows in batch order"
    total = sum(height for _, height in spill.parts)
    rank_of = pl.repeat(-1, total, dtype=pl.Int32, eager=True).scatter(
        rows.order, rows.scalars.get_column(c.RANK)
    )
    files: dict[int, list[Path]] = {rank: [] for rank in range(batch.meta.dp_size)}
    first = 0
    for index, (path, height) in enumerate(spill.parts):
        ranks = rank_of.slice(first, height)
        part = spill.part(index).with_columns(
            pl.int_range(first, first + height, dtype=pl.Int64).alias(_POSITION)
        )
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
        lists = held.drop(_POSITION)[where]
        del held
        picked = self.inputs[positions].hstack(lists)
        written = picked.select(
            pl.col(c.TOKENS), loss_masks(picked), *optional_shard_columns(self.optional)
        )
        return compact(self.scalars, start, length).hstack(written).select(*c.DATASET_COLUMNS)
