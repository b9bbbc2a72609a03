"""What one stage of a step hands the next: `SampleTable` (ingest -> plan) and `TrainBatch`
(plan -> write). The stages import these types from here, so no stage imports a later one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import polars as pl

from pipeline import columns as c
from pipeline.io.writer import ROW_GROUP
from pipeline.manifest import Manifest
from pipeline.transforms.shard_columns import loss_masks, optional_shard_columns


@dataclass
class SampleTable:
    """A step's valid rows in batch order (the `rollout_samples` asset)."""

    step: int
    frame: pl.DataFrame
    files: list[dict[str, Any]]  # path, sha256 and rows of each input file
    ignored_columns: list[str]
    ingested: int
    repaired: dict[str, int] = field(default_factory=dict)
    quarantine: pl.DataFrame | None = None
    # The light columns of `frame` (`transforms.samples.light_columns`) as validation
    # computed them, for the plan; None when not at hand (a staged table).
    light: pl.DataFrame | None = None
    # The columns as loaded, when `frame` holds its per-token lists reduced (the
    # rank-bounded build); None: `frame`'s own.
    columns: pl.Schema | None = None

    @property
    def schema(self) -> pl.Schema:
        """The step's columns as loaded, lists included."""
        return self.columns if self.columns is not None else self.frame.schema


@dataclass
class RankRows:
    """The shard columns of a batch before the list columns are gathered into write order."""

    scalars: pl.DataFrame  # the scalar shard columns and `rank`, in write order
    inputs: pl.DataFrame  # the input columns the list shard columns come from, in batch order
    optional: list[str]  # optional input columns that go into shards, in shard order
    order: pl.Series  # the batch position of each row in write order
    columns: tuple[str, ...] = c.DATASET_COLUMNS  # the rank files' columns (the trainer's)
    # Ranks the writer may gather and write at once (each holds its rows in memory).
    parallel_ranks: ClassVar[int] = 2

    def rows(self, start: int, length: int) -> pl.DataFrame:
        """Rows [start, start + length) in write order with every column, gathered: each
        row group's rows into buffers of their own (`by_group`)."""
        return self.written(start, self.inputs[by_group(self.order.slice(start, length))])

    def written(self, start: int, picked: pl.DataFrame) -> pl.DataFrame:
        """The rank-file columns of the rows [start, start + picked.height) from their input
        columns `picked` (lists included), gathered by row group (`by_group`)."""
        lists = picked.select(
            pl.col(c.TOKENS),
            loss_masks(picked),
            *optional_shard_columns(self.optional),
        )
        # by name, not `select`: a select of a frame with a literal column gives one chunk
        return compact(self.scalars, start, picked.height).hstack(lists)[list(self.columns)]

    def for_rank(self, start: int, length: int) -> RankRows:
        """Rows [start, start + length) alone, with only their own lists (what one rank's
        writer is shipped)."""
        order = self.order.slice(start, length)
        own = pl.int_range(length, dtype=pl.Int64, eager=True)
        scalars = compact(self.scalars, start, length)
        return RankRows(scalars, self.inputs[order], self.optional, own, self.columns)


def _report_columns(scalars: pl.DataFrame) -> pl.DataFrame | None:
    return scalars.select(c.REPORT_COLUMNS) if c.REPORT_GROUP in scalars.columns else None


def compact(frame: pl.DataFrame, start: int, length: int) -> pl.DataFrame:
    """Rows [start, start + length), each row group's in buffers of their own (`by_group`),
    whichever path (CLI or staged Dagster batch) produced the rows."""
    return frame[by_group(pl.int_range(start, start + length, dtype=pl.Int64, eager=True))]


def by_group(positions: pl.Series) -> pl.Series:
    """`positions` cut into a chunk per row group of a rank file (`writer.ROW_GROUP`): a
    frame's gather gives a chunk per chunk of its indices, so each group's rows land in
    buffers of their own. Polars before 2.2 sizes a row group's Parquet pages by the
    buffers it is cut from: a group held alone is written the same whichever path gathered
    it (in memory, from the spill, from the input files), and in fewer, larger pages than a
    slice of one big buffer (Polars 2.2 cuts pages alike either way)."""
    if positions.len() <= ROW_GROUP:
        return positions.rechunk()
    groups = [positions.slice(start, ROW_GROUP) for start in range(0, positions.len(), ROW_GROUP)]
    return pl.concat([group.rechunk() for group in groups], rechunk=False)


def gathered_columns(columns: list[pl.Series], where: pl.Series) -> pl.DataFrame:
    """The rows at `where` of `columns`, gathered by row group (`by_group`). The list is
    emptied as it goes: a column is freed once gathered, so the rows are held about once,
    not twice."""
    groups = by_group(where)
    gathered = []
    while columns:
        column = columns.pop(0)
        gathered.append(column.to_frame()[groups].to_series())
        del column
    return pl.DataFrame(gathered)


class TrainBatch:
    """The trimmed batch in write order with its shard columns and metadata (`train_batch`).

    `frame` holds every rank-file column (`c.DATASET_COLUMNS`), rank 0's rows first, each in
    training order. plan_batch hands over the list columns still in batch order (RankRows): `frame`
    gathers them on first use, while write_shards gathers one rank at a time, so a build
    never holds a second copy of the step's tokens.
    """

    def __init__(
        self,
        step: int,
        frame: pl.DataFrame | RankRows,
        meta: Manifest,
        quarantine: pl.DataFrame | None = None,
    ) -> None:
        self.step = step
        self.meta = meta
        self.quarantine = quarantine
        self._frame = frame if isinstance(frame, pl.DataFrame) else None
        self._rows = frame if isinstance(frame, RankRows) else None
        # the report's columns (`c.REPORT_COLUMNS`) of a gathered frame, kept beside it: a
        # staged frame (`staged_frame`) carries them, a rank file never does
        self._report: pl.DataFrame | None = None
        if self._frame is not None and c.REPORT_GROUP in self._frame.columns:
            self._report = self._frame.select(c.REPORT_COLUMNS)
            self._frame = self._frame.drop(c.REPORT_COLUMNS)

    @property
    def frame(self) -> pl.DataFrame:
        if self._frame is None:
            assert self._rows is not None
            self._frame = self._rows.rows(0, self._rows.scalars.height)
            self._report = _report_columns(self._rows.scalars)
            self._rows = None
        return self._frame

    def staged_frame(self) -> pl.DataFrame:
        """`frame` with the report's columns, as a staged batch keeps it (the batch made
        of it again splits them off)."""
        frame = self.frame
        return frame.hstack(self._report) if self._report is not None else frame

    def report_rows(self) -> pl.DataFrame:
        """The columns a step's report reads, in write order, without gathering the lists:
        `c.REPORT_SCALARS` and `c.REPORT_COLUMNS` (null where the batch came without them)."""
        if self._rows is not None:
            scalars = self._rows.scalars
            report = _report_columns(scalars)
        else:
            scalars, report = self.frame, self._report
        if report is None:
            report = pl.DataFrame(
                [
                    pl.repeat(None, scalars.height, dtype=pl.Int64, eager=True).alias(name)
                    for name in c.REPORT_COLUMNS
                ]
            )
        return scalars.select(c.REPORT_SCALARS).hstack(report)

    @property
    def rank_rows(self) -> RankRows | None:
        """The rows as planned, their lists still in batch order (None once gathered)."""
        return self._rows

    @property
    def parallel_ranks(self) -> int:
        """Ranks `write_shards` may write at once."""
        return self._rows.parallel_ranks if self._rows is not None else RankRows.parallel_ranks

    @property
    def height(self) -> int:
        """Rows of `frame`, without gathering it."""
        return self._rows.scalars.height if self._rows is not None else self.frame.height

    @property
    def schema(self) -> pl.Schema:
        """Columns and types of `frame`, without gathering it (from no rows)."""
        return self._rows.rows(0, 0).schema if self._rows is not None else self.frame.schema

    def ranks(self) -> pl.Series:
        """The `rank` column, in write order."""
        scalars = self._rows.scalars if self._rows is not None else self.frame
        return scalars.get_column(c.RANK)

    def rows(self, start: int, length: int) -> pl.DataFrame:
        """Rows [start, start + length) of `frame`, without gathering the others."""
        if self._rows is not None:
            return self._rows.rows(start, length)
        return compact(self.frame, start, length)
