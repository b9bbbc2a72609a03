"""Arrow IPC (`.arrow`, `.feather`): a file's bytes as a DataFrame, its columns as stored."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.ipc

from pipeline.io import arrow_types


def check_schema(data: bytes) -> None:
    """`arrow_types.UnsupportedType` for a column Polars would panic on; a file pyarrow
    cannot open is left for Polars' read to report."""
    try:
        schema = pyarrow.ipc.open_file(pa.BufferReader(data)).schema
    except (pa.ArrowException, OSError, ValueError):
        return
    arrow_types.check_schema(schema)


def read_ipc(data: bytes) -> pl.DataFrame:
    check_schema(data)
    return pl.read_ipc(data)
