"""Arrow types a Parquet or Arrow IPC file may declare that Polars cannot take. Polars
panics on them (a PanicException, a BaseException that would end the whole run, after
Rust has printed the panic to stderr) or fails with a message that names no column. A
read that fails is explained from the file's schema, read with pyarrow, which is only
imported then."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


def _unsupported(dtype: pa.DataType) -> bool:
    import pyarrow.types as pat

    return bool(
        pat.is_list_view(dtype)
        or pat.is_large_list_view(dtype)
        or pat.is_run_end_encoded(dtype)
        or pat.is_union(dtype)
        or pat.is_interval(dtype)
        or pat.is_decimal256(dtype)
    )


def _children(dtype: pa.DataType) -> list[pa.DataType]:
    import pyarrow.types as pat

    if pat.is_dictionary(dtype):
        return [dtype.index_type, dtype.value_type]
    return [dtype.field(i).type for i in range(dtype.num_fields)]


def unsupported_type(schema: pa.Schema) -> str | None:
    """`unsupported Arrow type <type> in column <name>` for the first column whose type,
    or a type nested in it, Polars cannot read; None when every column is readable."""
    for field in schema:
        pending = [field.type]
        while pending:
            dtype = pending.pop()
            if _unsupported(dtype):
                return f"unsupported Arrow type {dtype} in column {field.name}"
            pending += _children(dtype)
    return None


def unsupported_in(kind: str, data: bytes) -> str | None:
    """Why Polars cannot read a Parquet (`kind` "parquet") or Arrow IPC ("ipc") file's
    bytes, when its schema declares a type Polars does not take; None otherwise (or when
    pyarrow cannot read the schema either: Polars' own error is then the one to show)."""
    import pyarrow as pa
    import pyarrow.ipc
    import pyarrow.parquet as pq

    try:
        if kind == "parquet":
            schema = pq.read_schema(pa.BufferReader(data))
        else:
            schema = pyarrow.ipc.open_file(pa.BufferReader(data)).schema
    except (pa.ArrowException, OSError, ValueError):
        return None
    return unsupported_type(schema)


@contextmanager
def panics_kept_off_stderr() -> Iterator[list[bool]]:
    """While the block runs, the process's stderr (file descriptor 2, where Rust prints a
    panic) goes to a temporary file. What it received is passed on to stderr afterwards,
    unless the block set the yielded flag (a read that panicked): a panic is reported as
    one line of the file's, not as Rust's text."""
    sys.stderr.flush()
    panicked = [False]
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to keep clean
        yield panicked
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield panicked
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not panicked[0]:
                held.seek(0)
                if text := held.read():
                    os.write(2, text)
