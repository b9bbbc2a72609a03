"""A step read and written by tasks next to the data: the driver holds no per-token list.

The build of a step larger than one node (docs/scaling-out.md) runs the one driver
(`build.run_step`) with this reader and writer; the tasks run wherever `Tasks` puts them (a
Ray cluster, `step/ray_ranks.py`; or this process, `LocalTasks`):

1. read: the step's files are cut into shares (`split_shares`: a Parquet file by ranges of
   its row groups, found in its footer; any other file whole). A task per share reads it in
   parts, types and splits each part (`check.typed_part`) and returns the rows with each
   list's shape in its place and the scalars reduced from it; a task per Parquet file
   hashes it. The driver merges what the tasks found as a read in parts merges it (type
   violations into the whole read's line) and hands the rows to the one check
   (`check.check`), as every reader does;
2. plan on the driver, on those rows;
3. write (`readers.shuffle`): a task per share reads its rows' lists again from the input
   file, once, and splits them by rank; a task per rank gets its pieces, gathers them into
   training order and writes and seals its file (`write.write_rank`); the driver checks
   and commits the step (`write.commit_shards`). The quarantined trajectories take their
   lists back from the files by share (`share_lists`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import polars as pl

from pipeline import columns as c
from pipeline.columns import SOURCE_ROW
from pipeline.errors import StepError, Violation
from pipeline.io.discovery import SourceFile
from pipeline.io.load import is_parquet, read_in_parts, read_source
from pipeline.io.step_files import StepFiles
from pipeline.io.storage import ObjectPath
from pipeline.step.check import ReadStep, split_lists
from pipeline.step.readers.spill import PART_BYTES
from pipeline.step.tables import RankRows, TrainBatch, by_group, compact, gathered_columns

# Decoded bytes of Parquet row groups a share reads (a row group is never cut).
SHARE_BYTES = 64 << 20
SHARE = "_share"  # the share a loaded row came from

Call = tuple[Callable[..., Any], tuple[Any, ...]]


class Tasks(Protocol):
    """Runs calls, each as a task of its own, and returns their results in call order; the
    error of the first call (in call order) that fails is raised, the others abandoned."""

    def run(self, calls: Sequence[Call]) -> list[Any]: ...

    def scatter(self, calls: Sequence[tuple[Call, int]]) -> list[list[Any]]:
        """Runs calls that each return a list of `ways` pieces (the int beside the call) and
        returns, per call, a handle of each piece: a handle given as an argument to a call
        of `run` arrives there as its piece, and the pieces stay where they were made
        until then (on a cluster: in its object store, never in this process)."""
        ...


class LocalTasks:
    """`Tasks` in this process, one call after another."""

    def run(self, calls: Sequence[Call]) -> list[Any]:
        return [function(*arguments) for function, arguments in calls]

    def scatter(self, calls: Sequence[tuple[Call, int]]) -> list[list[Any]]:
        return [list(function(*arguments)) for (function, arguments), _ in calls]


# Bytes of typed rows this process decoded from input files (every task adds its own): what
# a task decoded is the difference across it (`ray_ranks` reports it per task).
DECODED = [0]


@dataclass(frozen=True)
class Share:
    """Rows of one input file that one task reads: Parquet row groups [first, end), or the
    whole file (`row_groups` None)."""

    step: int
    source: SourceFile
    file: int  # the file's place among the step's
    row_groups: tuple[int, int] | None = None


Identity = tuple[int, int, int, int]


def identity(path: Path) -> Identity:
    info = os.stat(path)
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _in_shares(source: SourceFile) -> bool:
    """Whether a file is read in shares of its row groups, hashed by a task of its own: a
    local Parquet file. Any other, an object in a store too, is one share read whole (one
    GET, `storage.fetch`), which hashes it as the in-memory read does."""
    return is_parquet(source) and not isinstance(source.path, ObjectPath)


def split_shares(
    step: int, sources: Sequence[SourceFile], share_bytes: int = SHARE_BYTES
) -> list[Share]:
    """The step's files as shares, in batch order. Only Parquet footers are read here; a
    file whose footer does not read is one share, whose task reports it as the read does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shares = []
    for place, source in enumerate(sources):
        try:
            meta = pq.ParquetFile(str(source.path)).metadata if _in_shares(source) else None
        except (pa.ArrowException, OSError, UnicodeEncodeError):  # pyarrow opens by name
            meta = None
        if meta is None or meta.num_row_groups == 0:
            shares.append(Share(step, source, place))
            continue
        first, size = 0, 0
        for group in range(meta.num_row_groups):
            size += meta.row_group(group).total_byte_size
            if size >= share_bytes or group == meta.num_row_groups - 1:
                shares.append(Share(step, source, place, (first, group + 1)))
                first, size = group + 1, 0
    return shares


@dataclass
class ShareRead:
    """What a share's task returns: the typed rows of each part, each list in its shape,
    with the lists' reductions; what typing found; the file's sha256 (a whole file only)."""

    frames: list[pl.DataFrame]
    found: list[tuple[int, str, Violation]]  # (place, column, violation), merged in the share
    extras: set[str]
    identity: Identity
    sha256: str | None


def typed_parts(share: Share, take: Callable[[pl.DataFrame], None]) -> tuple[StepFiles, Any]:
    """Read `share` in parts, each typed as every read types it (`StepFiles.add_rows`), to
    `take`."""
    files = StepFiles(share.step)
    seen = identity(share.source.path) if share.source.path.exists() else (0, 0, 0, 0)

    def typed(frame: pl.DataFrame, first: int) -> None:
        rows = files.add_rows(share.source, frame, first)
        DECODED[0] += int(rows.estimated_size())
        take(rows)

    if share.row_groups is None:  # a whole file, read as the in-memory read reads it
        read = read_source(share.source, share.step)
        typed(read.frame, 0)
        return files, (seen, read.sha256)
    sha256 = read_in_parts(share.source, share.step, PART_BYTES, typed, row_groups=share.row_groups)
    return files, (seen, sha256)


def read_share(share: Share) -> ShareRead:
    """The task of a share: its rows typed, lists reduced and left as shapes."""
    frames: list[pl.DataFrame] = []

    def take(typed: pl.DataFrame) -> None:
        frames.append(split_lists(typed)[0])  # the lists stay in the file

    files, (seen, sha256) = typed_parts(share, take)
    return ShareRead(frames, files.named(), files.extras, seen, sha256)


def file_digest(path: Path) -> tuple[str, Identity]:
    """The task that hashes a Parquet file read in shares. A file that cannot be read is
    its shares' to report, in the read's words: here it has no digest and no identity."""
    import hashlib

    try:
        seen = identity(path)
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest(), seen
    except OSError:
        return "", (0, 0, 0, 0)


def share_lists(share: Share, rows: pl.Series, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """The lists (`schema`'s columns) of the rows of `share` at these file rows (ascending),
    typed as the read typed them, read again from the file."""
    taken: list[pl.DataFrame] = []

    def take(typed: pl.DataFrame) -> None:
        mine = typed.filter(pl.col(SOURCE_ROW).is_in(rows.implode()))
        if mine.height:
            taken.append(
                mine.select(
                    pl.col(n) if n in mine.columns else pl.lit(None, dtype=d).alias(n)
                    for n, d in schema.items()
                )
            )

    typed_parts(share, take)
    return pl.concat(taken) if taken else pl.DataFrame(schema=schema)


def lists_at(
    place: pl.DataFrame,
    schema: dict[str, pl.DataType],
    fetch: Callable[[list[tuple[int, pl.Series]]], list[pl.DataFrame]],
) -> tuple[list[pl.Series], pl.Series]:
    """The lists the rows at `place` (SHARE, SOURCE_ROW per row) need, each list column
    once, and where each of those rows finds its lists among them: `fetch` gets each
    share's wanted file rows (ascending) and returns their lists."""
    wanted = place.unique().sort(SHARE, SOURCE_ROW)
    by_share = wanted.partition_by(SHARE, maintain_order=True, as_dict=True)
    asked = [(int(key[0]), part.get_column(SOURCE_ROW)) for key, part in by_share.items()]
    key = (pl.col(SHARE).cast(pl.Int64) * (1 << 40) + pl.col(SOURCE_ROW)).alias("key")
    # a gather gives a chunk per chunk of its indices
    where = wanted.select(key).to_series().search_sorted(place.select(key).to_series()).rechunk()
    held = pl.concat(fetch(asked)) if asked else pl.DataFrame(schema=schema)
    return held.get_columns(), where


class SourceRows(RankRows):
    """`RankRows` whose lists wait in the input files, where each rank's writer reads its
    own rows (`share_lists`): a writer holds its rank's lists, the driver none."""

    parallel_ranks = 1

    def __init__(
        self,
        rows: RankRows,
        shares: list[Share],
        place: pl.DataFrame,
        schema: dict[str, pl.DataType],
    ) -> None:
        super().__init__(rows.scalars, rows.inputs, rows.optional, rows.order, rows.columns)
        self.shares = shares
        self.place = place  # SHARE and SOURCE_ROW of each batch position
        self.schema = schema  # every list column of the step
        # Each share's piece of this rank's lists, when the shuffle (`readers.shuffle`)
        # brought them; None: read from the input files.
        self.held: dict[int, pl.DataFrame] | None = None

    def for_rank(self, start: int, length: int) -> RankRows:
        order = self.order.slice(start, length)
        own = pl.int_range(length, dtype=pl.Int64, eager=True)
        scalars = compact(self.scalars, start, length)
        mine = RankRows(scalars, self.inputs[order], self.optional, own, self.columns)
        return SourceRows(mine, self.shares, self.place[order], self.schema)

    def rows(self, start: int, length: int) -> pl.DataFrame:
        positions = self.order.slice(start, length).rechunk()
        held = self.held

        def fetch(asked: list[tuple[int, pl.Series]]) -> list[pl.DataFrame]:
            if held is not None:  # the pieces the shuffle brought: exactly the rows asked
                return [held[share] for share, _ in asked]
            return [share_lists(self.shares[share], rows, self.schema) for share, rows in asked]

        # gathered by row group, each list column freed once gathered
        lists = gathered_columns(*lists_at(self.place[positions], self.schema, fetch))
        return self.written(start, self.inputs[by_group(positions)].hstack(lists))


@dataclass
class SharesReader:
    """The reader (`readers.Reader`) of a step read and written by `tasks`; the check's
    `Lists` of its rows (read back from the files by tasks)."""

    tasks: Tasks
    share_bytes: int | None = None  # None: SHARE_BYTES
    shares: list[Share] = field(default_factory=list)
    places: pl.DataFrame | None = None  # SHARE and SOURCE_ROW of each loaded row
    place: pl.DataFrame | None = None  # SHARE and SOURCE_ROW of each kept row, batch order
    schema: dict[str, pl.DataType] = field(default_factory=dict)

    def read(self, job: Any) -> ReadStep:
        step = job.step
        self.shares = split_shares(step, job.sources, self.share_bytes or SHARE_BYTES)
        calls: list[Call] = []
        for place, source in enumerate(job.sources):
            if _in_shares(source):
                calls.append((file_digest, (source.path,)))
            calls += [(read_share, (share,)) for share in self.shares if share.file == place]
        results = iter(self.tasks.run(calls))
        files, places = StepFiles(step), []
        for place, source in enumerate(job.sources):
            digest = next(results) if _in_shares(source) else None
            mine = [i for i, share in enumerate(self.shares) if share.file == place]
            rows, seen = 0, {digest[1]} if digest else set()
            sha256 = digest[0] if digest else None
            for index in mine:
                read: ShareRead = next(results)
                sha256 = sha256 or read.sha256
                for where, name, violation in read.found:
                    files.add_type_violation(source, where, name, violation)
                files.extras.update(read.extras)
                files.frames += read.frames
                for frame in read.frames:
                    rows += frame.height
                    places.append(frame.select(pl.lit(index, pl.Int32).alias(SHARE), SOURCE_ROW))
                seen.add(read.identity)
            if len(seen) > 1:
                raise _changed(source, step)
            assert sha256 is not None, "a file is hashed by its digest's task or its read"
            files.add_file(source, sha256, rows)
        loaded = files.loaded()
        self.places = pl.concat(places)
        self.schema = {
            n: loaded.frame.schema[n] for n in c.PER_TOKEN_COLUMNS if n in loaded.frame.columns
        }
        return ReadStep(loaded, self)

    def take(self, rows: pl.Series) -> list[pl.Series]:
        """The lists of the loaded rows `rows`, read back from the files by tasks."""
        assert self.places is not None, "lists of a share read"

        def fetch(asked: list[tuple[int, pl.Series]]) -> list[pl.DataFrame]:
            calls = [(share_lists, (self.shares[i], rows, self.schema)) for i, rows in asked]
            return list(self.tasks.run(calls))

        held, where = lists_at(self.places.gather(rows), self.schema, fetch)
        return [column.gather(where) for column in held]

    def keep(self, rows: pl.Series) -> None:
        assert self.places is not None, "lists of a share read"
        self.place = self.places.gather(rows)

    def planned(self, batch: TrainBatch) -> TrainBatch:
        rows = batch.rank_rows
        assert rows is not None and self.place is not None, "a planned batch of a share read"
        source_rows = SourceRows(rows, self.shares, self.place, self.schema)
        return TrainBatch(batch.step, source_rows, batch.meta, batch.quarantine)


def _changed(source: SourceFile, step: int) -> StepError:
    message = "the file changed while it was read: build again"
    files = [str(source.path)]
    return StepError([Violation(rule="unreadable_file", message=message, step=step, files=files)])


def rank_batch(batch: TrainBatch, rank: int, bounds: list[int]) -> TrainBatch:
    """What one rank's writer needs of `batch`: that rank's planned rows, and where their
    lists wait; no other rank's rows."""
    rows = batch.rank_rows
    assert rows is not None, "a planned batch holds its lists in batch order"
    mine = rows.for_rank(bounds[rank], bounds[rank + 1] - bounds[rank])
    return TrainBatch(batch.step, mine, batch.meta)


def by_tasks(job: Any, tasks: Tasks) -> Any:
    """`job` (a `build.StepJob`) read and written by `tasks`."""
    from pipeline.step.readers.shuffle import write_by

    def reader(_: Any, stack: ExitStack) -> SharesReader:
        return SharesReader(tasks)

    return replace(job, reader=reader, write_batch=write_by(tasks), tasks=tasks)
