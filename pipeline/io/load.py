"""Load a step: read each of its files, record the sha256 of the bytes read (a file that
changes during its read fails the step), type the rows (`conform`) and concatenate them in
batch order with provenance."""

from __future__ import annotations

import hashlib
import io
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, Violation, first_line
from pipeline.io import storage
from pipeline.io.arrow_types import panics_kept_off_stderr, unsupported_in
from pipeline.io.conform import cast_column, index_leaf_pairs, value_text
from pipeline.io.discovery import TABLE_SUFFIXES, SourceFile
from pipeline.io.formats import FORMATS, read_dump
from pipeline.io.formats.names import not_a_file
from pipeline.io.ipc import read_ipc
from pipeline.io.jsonl import JsonLinesError, read_jsonl
from pipeline.io.parquet import Mapper, read_parquet
from pipeline.io.step_files import LoadedStep, StepFiles
from pipeline.io.storage import ObjectPath
from pipeline.speed import (
    Digest,
    EarlyDigests,
    Identity,
    read_threads,
    returning_arrow_pool,
    thread_pool,
)

PanicException = pl.exceptions.PanicException  # a BaseException: it would end the run

# Bytes a Parquet read in parts buffers of a column at a time.
PART_BUFFER = 1 << 20

# A file's sha256 taken before its read (`rollout-shards build` hashes its inputs while the
# program loads), with the file's identity while it was hashed; None when it was not taken.
EarlyDigest = Digest


# Each format's reader, given the file's bytes (read once, hashed from memory) and the `map`
# of the read's pool. Never a path: Polars maps a Parquet file it is given by name, and a
# file truncated by another process while mapped kills the build with SIGBUS; read into
# memory, a truncated file is a short read, an `unreadable_file` line.
READERS: dict[str, Callable[[Any, Mapper], pl.DataFrame]] = {
    "parquet": read_parquet,
    "ipc": lambda data, _: read_ipc(data),
    "jsonl": lambda data, _: read_jsonl(data),
}


@dataclass
class ReadFile:
    """One file as read: its rows as stored and the sha256 of the bytes they came from."""

    frame: pl.DataFrame
    sha256: str
    size: int


def _unreadable(path: Path, step: int | None, reason: str) -> StepError:
    return StepError(
        [Violation(rule="unreadable_file", message=reason, step=step, files=[str(path)])]
    )


def _identity(info: os.stat_result) -> Identity:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _check_unchanged(path: Path, info: os.stat_result, step: int | None) -> None:
    """A file whose identity (inode, size, modification and change times) moved since it
    was opened as `info`, or that is gone, fails rather than vouch for other bytes."""
    try:
        after = os.stat(path)
    except OSError:
        after = None
    if after is None or _identity(after) != _identity(info):
        raise _unreadable(path, step, "the file changed while it was read: build again")


def _opened(path: Path, step: int | None) -> tuple[io.BufferedReader, os.stat_result]:
    """The file, open. Opened without blocking (a FIFO put in a file's place would wait for
    a writer forever) and refused unless a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        why = not_a_file(path) or exc.strerror
        raise _unreadable(path, step, f"cannot open the file ({why})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # checked before `fdopen`, which refuses a folder
        os.close(fd)
        why = not_a_file(path) or "not a regular file"
        raise _unreadable(path, step, f"cannot open the file ({why})")
    handle = os.fdopen(fd, "rb")
    return handle, info


def _read_bytes(path: Path, step: int | None) -> tuple[bytes, os.stat_result]:
    """The file's bytes, read once (`_opened`)."""
    handle, info = _opened(path, step)
    with handle:
        try:
            return handle.read(), info
        except OSError as exc:
            raise _unreadable(path, step, f"cannot read the file ({exc.strerror})") from None


def _utf8(path: Path) -> bool:
    """Whether pyarrow can open `path` by name (a name that is not UTF-8 is read as bytes)."""
    try:
        str(path).encode()
    except UnicodeEncodeError:
        return False
    return True


def _digest(handle: io.BufferedReader, data: bytes | None) -> str:
    if data is not None:
        return hashlib.sha256(data).hexdigest()
    return hashlib.file_digest(handle, "sha256").hexdigest()


def _taken(early: EarlyDigest | None, info: os.stat_result) -> str | None:
    """The early digest, if it was taken of the file as it is open now (same identity)."""
    taken = early.result() if early is not None else None
    return taken[1] if taken is not None and taken[0] == _identity(info) else None


def read_file(path: Path, step: int | None = None, early: EarlyDigest | None = None) -> ReadFile:
    """One input file as stored, in file order, with the sha256 of the bytes read (`early`'s
    when it was taken of the file with the identity it has through the read); a file whose
    identity (inode, size, modification and change times) moved while it was read fails
    rather than vouch for other bytes. An unreadable file is a StepError."""
    handle, info = _opened(path, step)
    with handle:
        kind = TABLE_SUFFIXES.get(path.suffix)
        if kind is None:
            expected = ", ".join(TABLE_SUFFIXES)
            raise _unreadable(path, step, f"not a table (expected {expected})")
        if info.st_size == 0:
            raise _unreadable(path, step, "the file is empty")
        try:
            data = handle.read()
        except OSError as exc:
            raise _unreadable(path, step, f"cannot read the file ({exc.strerror})") from None
        try:
            threads = read_threads()
            with panics_kept_off_stderr() as panicked, thread_pool(threads) as pool:
                parallel = threads > 1
                digest = pool.submit(_digest, handle, data) if early is None and parallel else None
                try:
                    mapper = pool.map if parallel else map
                    frame = READERS[kind](data, mapper)
                except pl.exceptions.PanicException:  # a BaseException: it would end the run
                    panicked[0] = True
                    raise
                taken = _taken(early, info)
                if taken is None and digest is None:
                    digest = pool.submit(_digest, handle, data) if parallel else None
                sha256 = taken or (digest.result() if digest else _digest(handle, data))
        except JsonLinesError as exc:
            raise _unreadable(path, step, str(exc)) from None
        except OSError as exc:
            raise _unreadable(path, step, f"cannot read the file ({exc.strerror})") from None
        except (Exception, pl.exceptions.PanicException) as exc:  # noqa: BLE001 - the file's
            problem = unsupported_in(kind, data) if kind != "jsonl" else None
            reason = problem or f"cannot read {kind}: {first_line(exc)}"
            raise _unreadable(path, step, reason) from None
    _check_unchanged(path, info, step)
    return ReadFile(frame, sha256, info.st_size)


def read_table(path: Path, step: int | None = None) -> pl.DataFrame:
    """One input file's rows as stored (`read_file`)."""
    return read_file(path, step).frame


def _read_dump(source: SourceFile, step: int | None) -> ReadFile:
    """A trainer's dump (`pipeline.io.formats`), hashed before it is parsed; a dump that
    changed in between (another inode, size, or modification) fails the step rather than
    vouch for other bytes."""
    data, before = _read_bytes(source.path, step)
    options = {"session_version": source.session_version}
    frame = read_dump(FORMATS[source.kind], source.path, source.step, **options)
    _check_unchanged(source.path, before, step)
    return ReadFile(frame, hashlib.sha256(data).hexdigest(), before.st_size)


def read_object(path: ObjectPath, step: int | None) -> ReadFile:
    """An input object of a store (one GET), parsed from the bytes fetched and hashed from
    them, as `read_file` parses and hashes a file's bytes: an object is replaced whole,
    never changed in place, so one GET is one version of it."""
    kind = TABLE_SUFFIXES[path.suffix]
    try:
        data = storage.fetch(path)
    except OSError as exc:
        raise _unreadable(path, step, f"cannot read the object ({exc.strerror or exc})") from None
    if not data:
        raise _unreadable(path, step, "the object is empty")
    try:
        with panics_kept_off_stderr() as panicked:
            try:
                frame = READERS[kind](data, map)
            except pl.exceptions.PanicException:  # a BaseException: it would end the run
                panicked[0] = True
                raise
    except JsonLinesError as exc:
        raise _unreadable(path, step, str(exc)) from None
    except (Exception, pl.exceptions.PanicException) as exc:  # noqa: BLE001 - the object's
        problem = unsupported_in(kind, data) if kind != "jsonl" else None
        raise _unreadable(path, step, problem or f"cannot read {kind}: {first_line(exc)}") from None
    return ReadFile(frame, hashlib.sha256(data).hexdigest(), len(data))


def read_source(
    source: SourceFile, step: int | None = None, early: EarlyDigest | None = None
) -> ReadFile:
    if isinstance(source.path, ObjectPath):
        return read_object(source.path, step)
    if source.kind in FORMATS:
        return _read_dump(source, step)
    return read_file(source.path, step, early)


def _column_steps(source: SourceFile, frame: pl.DataFrame) -> list[int]:
    """The steps named by the `step` column of a file whose path names none; every row
    must name one, since a row without a step belongs to no step's accounting."""
    if c.STEP not in frame.columns:
        raise StepError(
            [
                Violation(
                    rule="missing_column",
                    message="no step in the file name (step=<N>.<ext>) and no step column",
                    files=[str(source.path)],
                )
            ]
        )
    with_rows = frame.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(c.SOURCE_ROW))
    json_numbers = source.path.suffix == ".jsonl"
    cast, bad = cast_column(with_rows, c.STEP, pl.Int64(), json_numbers)
    bad = bad | frame.get_column(c.STEP).is_null()
    if bad.any():
        rows = with_rows.filter(bad)
        first = int(rows.get_column(c.SOURCE_ROW)[0]) + 1
        raise StepError(
            [
                Violation(
                    rule="column_type",
                    message="column step must hold a step number on every row when the file "
                    f"name carries no step; file row {first} has {value_text(frame, c.STEP, bad)}",
                    files=[str(source.path)],
                    rows=index_leaf_pairs(rows),
                    n_rows=rows.height,
                )
            ]
        )
    return frame.select(cast).to_series().unique().sort().to_list()


def group_steps(sources: Iterable[SourceFile]) -> dict[int, list[SourceFile]]:
    """Steps and their files in lexicographic path order; files without a path step are
    assigned by the values of their `step` column."""
    steps: dict[int, list[SourceFile]] = {}
    for source in sources:
        if source.step is not None:
            steps.setdefault(source.step, []).append(source)
            continue
        try:
            values = _column_steps(source, read_source(source).frame)
        except StepError as error:
            for violation in error.violations:
                violation.message += (
                    "; no step was built: the rows of a file whose name carries no step "
                    "could belong to any step, so no step can be called complete"
                )
            raise
        for value in values:
            steps.setdefault(int(value), []).append(source)
    return {step: sorted(files, key=lambda s: str(s.path)) for step, files in sorted(steps.items())}


def load_step(
    step: int, sources: Sequence[SourceFile], early: EarlyDigests | None = None
) -> LoadedStep:
    """Read, type and concatenate a step's files in batch order, with provenance columns.
    Each file's manifest record (path, sha256, rows) is of the bytes its rows came from;
    `early` gives the digests taken before the read."""
    step_files = StepFiles(step)
    for source in sources:
        read = read_source(source, step, early(source.path) if early is not None else None)
        frame = step_files.add_rows(source, read.frame)
        step_files.add_file(source, read.sha256, frame.height)
        step_files.frames.append(frame)
    return step_files.loaded()


def read_in_parts(
    source: SourceFile,
    step: int,
    part_bytes: int,
    take: Callable[[pl.DataFrame, int], None],
    early: EarlyDigest | None = None,
    row_groups: tuple[int, int] | None = None,
) -> str | None:
    """Hand `take` the rows of one input file as stored, in parts of about `part_bytes`
    decoded bytes each with the file row of its first row, and return the file's sha256.
    A Parquet file comes in row batches (`pyarrow`, which decodes a batch at a time where
    Polars decodes a row group whole), hashed on a thread meanwhile; any other file whole.
    With `row_groups` (first, end), only those row groups of a Parquet file are read and
    the file is not hashed (None is returned): a share of the file (`step.readers.shares`).
    A file whose identity moved while it was read fails as `read_file` does. A file that
    pyarrow cannot read in batches is read whole, as the in-memory read reads it
    (`_read_rest`): its rows or its line are that read's, whichever reader reads it."""
    path = source.path
    if not is_parquet(source):
        read = read_source(source, step, early)
        take(read.frame, 0)
        return read.sha256
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not _utf8(path):  # pyarrow opens a file by its name, which must be UTF-8
        handle, _ = _opened(path, step)
        handle.close()
        assert row_groups is None, "a share is of a file pyarrow opened (`split_shares`)"
        return _read_rest(source, step, (0, None), take, None, False)
    handle, info = _opened(path, step)
    with handle, thread_pool(1) as pool, returning_arrow_pool():
        # A digest begun early is waited for once the rows are read, never before: the
        # head start may still be hashing this file while it decodes.
        hashing = early is None and row_groups is None
        digest = pool.submit(_digest, handle, None) if hashing else None

        try:
            parquet = pq.ParquetFile(str(path), buffer_size=PART_BUFFER, pre_buffer=False)
            meta = parquet.metadata
            decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            rows = max(1, part_bytes * max(meta.num_rows, 1) // max(decoded, 1))
            start, end = row_groups or (0, meta.num_row_groups)
            batches = parquet.iter_batches(
                batch_size=rows, row_groups=range(start, end), use_threads=True
            )
        except (pa.ArrowException, OSError) as exc:
            if row_groups is not None:  # its footer read before: the file changed since
                raise _unreadable(path, step, f"cannot read parquet: {first_line(exc)}") from None
            return _read_rest(source, step, (0, None), take, None, False)
        first = sum(meta.row_group(i).num_rows for i in range(start))
        last = first + sum(meta.row_group(i).num_rows for i in range(start, end))
        handed = False
        while True:
            # pyarrow's and the conversion's errors only: `take`'s (a full spill disk, say)
            # are its own
            try:
                batch = next(batches, None)
                frame = pl.from_arrow(batch) if batch is not None else None
            except (pa.ArrowException, OSError, pl.exceptions.PolarsError, PanicException):
                whole = _read_rest(source, step, (first, last), take, rows, handed)
                return whole if row_groups is None else None
            if frame is None:
                break
            assert isinstance(frame, pl.DataFrame)
            del batch
            take(frame, first)
            handed = True
            first += frame.height
            del frame
        if not handed:  # no rows: the file's columns, as a whole read gives them
            whole = _read_rest(source, step, (first, last), take, None, False)
            return whole if row_groups is None else None
        sha256 = None  # a share's read hashes nothing
        if digest is not None:
            sha256 = digest.result()
        elif row_groups is None:  # the early digest, unless it was of other bytes
            sha256 = _taken(early, info) or _digest(handle, None)
    _check_unchanged(path, info, step)
    return sha256


def _read_rest(
    source: SourceFile,
    step: int,
    rows: tuple[int, int | None],
    take: Callable[[pl.DataFrame, int], None],
    part: int | None,
    handed: bool,
) -> str:
    """Rows [first, end) (None: to the last) of a Parquet file pyarrow could not read in
    batches (a corrupted page, a nested column of dictionaries across row groups), read
    whole as the in-memory read reads it (`read_file`: its line when it fails), handed on
    in parts of `part` rows (None: at once); `handed`: whether earlier rows were. The
    file's sha256."""
    read = read_file(source.path, step)
    first, end = rows
    stop = read.frame.height if end is None else min(end, read.frame.height)
    size = max(1, part or stop - first)
    for offset in range(first, stop, size):
        take(read.frame.slice(offset, min(size, stop - offset)), offset)
        handed = True
    if not handed:
        take(read.frame.clear(), first)
    return read.sha256


def is_parquet(source: SourceFile) -> bool:
    """Whether `source` is a Parquet table (read in row batches, and in shares of its row
    groups); any other file is read whole."""
    return source.kind == "table" and source.path.suffix == ".parquet"
