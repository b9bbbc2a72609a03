"""The step read in parts, its per-token lists spilled: the build holds a few parts, or two
ranks, of lists at a time.

The in-memory build holds the whole step; nearly all of its bytes are the lists with a value
per token (`c.PER_TOKEN_COLUMNS`), which only the writer needs whole, and only one rank at a
time. Here:

1. read: each input file comes in parts (`io.load.read_in_parts`); a part is typed and split
   (`check.typed_part`): its rows keep each list's shape and the per-row scalars the rules,
   the plan and the metrics read, its lists go to an uncompressed Arrow file (with the
   parts before it, up to `FILE_BYTES`) in a private folder of the output root (`Spill`);
2. the check (`check.check`) validates the rows as it validates every reader's; the
   trajectories a quarantine sets aside take their lists back from the spill (`Spill.take`);
3. write: `write_shards` asks for each rank's rows; `SpilledRows` takes that rank's lists
   from each spill file, mapped, reading only their pages, each row group's rows into
   buffers of their own as the in-memory build gathers them (`tables.by_group`), so the
   files are byte-identical: rows in spill order straight from the files (`take_groups`),
   others taken (`take_rows`) and gathered into training order.

The driver (`step.build`) chooses this read up front, from the size of the step's input
files (the `stream_above` setting), and reads a step once.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import polars as pl

from pipeline.io import writer
from pipeline.io.discovery import SourceFile
from pipeline.io.load import read_in_parts
from pipeline.io.step_files import StepFiles
from pipeline.io.writer import ROW_GROUP
from pipeline.speed import (
    SmallWrites,
    on,
    one_at_a_time,
    read_threads,
    thread_pool,
    write_threads,
)
from pipeline.step.check import ReadStep, typed_part
from pipeline.step.tables import RankRows, TrainBatch, by_group, compact, gathered_columns

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.step.build import StepJob

# Decoded bytes of one part of an input file: what the read holds at once beside the
# rows without their lists.
PART_BYTES = 16 << 20
# Spilled bytes from which the next part starts a file of its own: each rank's writer maps
# every file in turn, and a file of several parts is one map and one frame for them all.
FILE_BYTES = 48 << 20
# Spilled bytes per rank from which two ranks are written at once (`SpilledRows`): below
# it a second rank's lists weigh more against the process's fixed memory than the overlap
# saves in time (at 128k samples and dp 8 they took the build past half the floor's peak).
TWO_RANKS_FROM = 256 << 20


def input_bytes(sources: Sequence[SourceFile]) -> int:
    """The bytes of the step's input files on disk (a file that cannot be read counts 0:
    its reader reports it)."""
    total = 0
    for source in sources:
        try:
            total += os.stat(source.path).st_size
        except OSError:
            pass
    return total


class Spill:
    """A private folder of the output root holding one build's lists until they are written
    (`writer.private_name`: its files removed once the writer has taken every row, the
    folder when the build ends, however it ends; on an interrupt by `writer.remove_held`; a
    killed build's folder by the next build). The check's `Lists` of a read in parts."""

    def __init__(self, out_root: Path, step: int) -> None:
        out_root.mkdir(parents=True, exist_ok=True)
        self.folder = out_root / writer.private_name("tmp", f"spill-step={step}")
        writer.hold(self.folder)
        self.folder.mkdir()
        # each file's path, first loaded position and rows, in load order (a file holds
        # consecutive parts of one schema)
        self.parts: list[tuple[Path, int, int]] = []
        self._open: SpillFile | None = None  # the file the next part of its schema joins
        self.rows = 0  # rows spilled so far
        self.schema: dict[str, pl.DataType] = {}  # every list column any part has
        # The loaded position of each row of the batch, in batch order; None: every row.
        self.kept: pl.Series | None = None
        self._remover = thread_pool(1) if write_threads()[1] else None

    def __enter__(self) -> Spill:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        with suppress(OSError):  # the build's error is the one to report
            self.close()
        if self._remover is not None:
            self._remover.shutdown()
        shutil.rmtree(self.folder, ignore_errors=True)
        writer.release(self.folder)

    def all_taken(self) -> None:
        """Every row's lists have been taken for the write: the files are removed now, on a
        thread while the last ranks are encoded (with the writer's threads off, when the
        build ends). Freeing a file's pages waits for those being written back to disk,
        which a build's end would wait for."""
        if self._remover is not None:
            self._remover.submit(_remove, [path for path, _, _ in self.parts])

    def add(self, lists: pl.DataFrame) -> None:
        table = lists.to_arrow()
        held = self._open
        if held is not None and (held.schema != table.schema or held.bytes >= FILE_BYTES):
            self.close()
        if self._open is None:
            self._open = SpillFile(self.folder / f"part={len(self.parts)}.arrow", table.schema)
            self.parts.append((self._open.path, self.rows, 0))
        self._open.write(table)
        path, first, rows = self.parts[-1]
        self.parts[-1] = (path, first, rows + lists.height)
        self.rows += lists.height
        for name, dtype in lists.schema.items():
            self.schema.setdefault(name, dtype)

    def close(self) -> None:
        """Finish the file being written: the spill is read from here on."""
        if self._open is not None:
            held, self._open = self._open, None
            held.close()

    def take(self, rows: pl.Series) -> list[pl.Series]:
        return take_rows(self.parts, self.schema, rows).get_columns()

    def keep(self, rows: pl.Series) -> None:
        self.kept = rows


def _remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


class SpillReader:
    """The reader (`readers.Reader`) of a step read in parts (of `part_bytes`, by default
    `PART_BYTES`) into `spill`."""

    def __init__(self, spill: Spill, part_bytes: int | None = None) -> None:
        self.spill = spill
        self.part_bytes = part_bytes

    def read(self, job: StepJob) -> ReadStep:
        step, spill = job.step, self.spill
        files = StepFiles(step)
        # A part is typed and spilled on a thread of its own while the next part decodes
        # (pyarrow and Polars both work without the GIL): on the caller's thread the two
        # take turns and each leaves a core idle. One part at a time, in order, so the
        # parts are typed and spilled as on one thread; a part waits for the one before.
        with thread_pool(1) as typing:
            for source in job.sources:
                rows = 0
                pending: Future[None] | None = None

                def part(frame: pl.DataFrame, first: int, source: SourceFile = source) -> None:
                    nonlocal rows
                    light, lists = typed_part(files, source, frame, first)
                    spill.add(lists)
                    files.frames.append(light)
                    rows += light.height

                def take(frame: pl.DataFrame, first: int) -> None:
                    nonlocal pending
                    if pending is not None:
                        pending.result()  # the part before, typed and spilled (or its error)
                    if read_threads() > 1:
                        pending = typing.submit(part, frame, first)
                    else:
                        part(frame, first)

                taken = job.early(source.path) if job.early is not None else None
                try:
                    sha256 = read_in_parts(source, step, self.part_bytes or PART_BYTES, take, taken)
                except BaseException:
                    if pending is not None:  # the read's error first; the part's is later
                        wait([pending])
                    raise
                if pending is not None:
                    pending.result()  # the last part (its error, a full spill disk, say)
                assert sha256 is not None, "a whole file is hashed"
                files.add_file(source, sha256, rows)
        spill.close()
        return ReadStep(files.loaded(), spill)

    def planned(self, batch: TrainBatch) -> TrainBatch:
        return spilled(batch, self.spill)


class SpillFile:
    """An uncompressed Arrow file at `path` taking tables of one schema until `close`, which
    writes its footer. Its bytes go to the kernel in small writes (`speed.SmallWrites`)
    where `small_writes` is on, in whole buffers where it is off; a full disk is the OSError
    it is."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        import pyarrow as pa
        import pyarrow.ipc

        self.path, self.schema = path, schema
        self.bytes = 0  # the tables' bytes written so far
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            small = on("small_writes")
            self._sink = SmallWrites(self._fd) if small else open(self._fd, "wb", closefd=False)
            self._writer = pyarrow.ipc.new_file(pa.PythonFile(self._sink, mode="w"), schema)
        except BaseException:
            os.close(self._fd)
            raise

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table)
        self.bytes += table.nbytes

    def close(self) -> None:
        try:
            self._writer.close()
            self._sink.flush()
        finally:
            os.close(self._fd)


def take_rows(
    parts: list[tuple[Path, int, int]], schema: dict[str, pl.DataType], wanted: pl.Series
) -> pl.DataFrame:
    """The lists of the rows at these loaded positions (ascending), in that order, from the
    spill files `parts` (file, first loaded position, rows). Each file is mapped
    (`pyarrow.memory_map`) and only the wanted rows' pages are read; a file is unmapped
    before the next, so no more than one file's pages are resident besides the rows."""
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
        taken.append(_with_schema(frame, schema))
    return pl.concat(taken) if taken else _empty(schema)


def _with_schema(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """`frame`'s columns of `schema`, a column the spill file lacks all null."""
    return frame.select(
        pl.col(n) if n in frame.columns else pl.repeat(None, frame.height, dtype=d).alias(n)
        for n, d in schema.items()
    )


def _empty(schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def take_groups(
    parts: list[tuple[Path, int, int]], schema: dict[str, pl.DataType], wanted: pl.Series
) -> pl.DataFrame:
    """`take_rows` of rows whose loaded positions `wanted` ascend in write order, taken from
    the mapped files straight into buffers of their own per row group of the rank file
    (`tables.by_group`); a group that spans two files joins its pieces."""
    import pyarrow as pa
    import pyarrow.ipc

    pieces: list[list[pl.DataFrame]] = [[] for _ in range(0, max(wanted.len(), 1), ROW_GROUP)]
    taken = 0
    for path, first, height in parts:
        local = wanted.filter((wanted >= first) & (wanted < first + height)) - first
        if local.is_empty():
            continue
        # cut where the rank's row groups begin: the file's first piece ends the group
        # an earlier file began
        starts = [0, *range(-taken % ROW_GROUP or ROW_GROUP, local.len(), ROW_GROUP)]
        ends = [*starts[1:], local.len()]
        cuts = [local.slice(a, b - a) for a, b in zip(starts, ends, strict=True)]
        with pa.memory_map(str(path)) as source:
            mapped = pl.from_arrow(pyarrow.ipc.open_file(source).read_all())
            assert isinstance(mapped, pl.DataFrame)
            got = mapped[pl.concat(cuts, rechunk=False)]  # a chunk per cut
            del mapped
        at = 0
        for cut in cuts:
            group = (taken + at) // ROW_GROUP
            pieces[group].append(_with_schema(got.slice(at, cut.len()), schema))
            at += cut.len()
        taken += local.len()
    groups = [
        group[0] if len(group) == 1 else pl.concat(group).rechunk() for group in pieces if group
    ]
    return pl.concat(groups, rechunk=False) if groups else _empty(schema)


def spilled(batch: TrainBatch, spill: Spill) -> TrainBatch:
    """The planned batch with its lists left in the spilled parts, where each rank's writer
    gathers its own rows (`SpilledRows`)."""
    rows = batch.rank_rows
    assert rows is not None, "a planned batch holds its rows in batch order"
    # the loaded position of each batch position
    loaded = spill.kept if spill.kept is not None else pl.int_range(spill.rows, eager=True)
    spilled_bytes = sum(os.stat(path).st_size for path, _, _ in spill.parts)
    big = spilled_bytes // max(batch.meta.dp_size, 1) >= TWO_RANKS_FROM
    rank_rows = (BigSpilledRows if big else SpilledRows)(
        rows, spill.parts, loaded, spill.schema, spill.all_taken
    )
    return TrainBatch(batch.step, rank_rows, batch.meta, batch.quarantine)


class SpilledRows(RankRows):
    """`RankRows` whose lists wait in the spilled parts (`take_rows`); the writer takes one
    rank at a time, so that the build holds one rank's lists, or two where ranks are big
    (`BigSpilledRows`)."""

    parallel_ranks = 1

    def __init__(
        self,
        rows: RankRows,
        parts: list[tuple[Path, int, int]],
        loaded: pl.Series,
        schema: dict[str, pl.DataType],
        all_taken: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(rows.scalars, rows.inputs, rows.optional, rows.order, rows.columns)
        self.parts = parts  # each spill file, its first loaded position and rows
        self.loaded = loaded  # the loaded position of each batch position
        self.schema = schema  # every list column any part has
        self.all_taken = all_taken  # told once every row has been taken (`Spill.all_taken`)
        self._untaken = self.order.len()
        self._gathering = one_at_a_time()  # held by the writer's thread gathering a rank

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
        # One rank gathers at a time; the other's file is encoded meanwhile. Two ranks
        # gathering at once would each hold their lists about twice at the same moment.
        with self._gathering:
            return self._gathered(start, length)

    def _gathered(self, start: int, length: int) -> pl.DataFrame:
        positions = self.order.slice(start, length).rechunk()
        loaded = self.loaded.gather(positions)
        if loaded.is_sorted():  # in spill order: each row group taken straight from the files
            lists = take_groups(self.parts, self.schema, loaded)
        else:
            wanted = loaded.sort()
            where = wanted.search_sorted(loaded)
            lists = gathered_columns(
                take_rows(self.parts, self.schema, wanted).get_columns(), where
            )
        self._untaken -= length
        if self._untaken == 0 and length > 0 and self.all_taken is not None:
            self.all_taken()
        return self.written(start, self.inputs[by_group(positions)].hstack(lists))


class BigSpilledRows(SpilledRows):
    """`SpilledRows` of ranks of `TWO_RANKS_FROM` spilled bytes or more, written two at once
    as in memory: one rank's gather from the spill overlaps the other's encode (each alone
    leaves a core idle), for a second rank's lists in memory."""

    parallel_ranks = 2
