"""Parquet: a file's bytes as a DataFrame, its columns as the file stores them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

import polars as pl

# Below this size several reads (each parsing the footer) cost more than a second core saves
# (bench/results/).
SPLIT_READ_BYTES = 4 << 20

Columns = list[str]
# `map` of the read's thread pool (`io.load`), or the builtin for a read on this thread.
Mapper = Callable[[Callable[[Columns], pl.DataFrame], Iterable[Columns]], Iterator[pl.DataFrame]]


def read_parquet(source: str | bytes, mapper: Mapper = map) -> pl.DataFrame:
    """A Parquet file (its path or bytes); with a pool's `mapper`, its list columns each
    decoded apart.

    Polars decodes a row group's columns one after another, and writers such as pyarrow
    put a whole step in one row group, so a plain read keeps one core busy; the list
    columns hold nearly all the bytes. Any failure of the split read falls back to a plain
    read, whose error is the one to report."""
    size = len(source) if isinstance(source, bytes) else os.path.getsize(source)
    if size < SPLIT_READ_BYTES or mapper is map:
        return pl.read_parquet(source)
    try:
        schema = pl.read_parquet_schema(source)
        lists = [name for name, dtype in schema.items() if isinstance(dtype, pl.List)]
        rest = [name for name in schema if name not in lists]
        groups = [[name] for name in lists] + ([rest] if rest else [])
        if len(groups) < 2:
            return pl.read_parquet(source)
        parts = list(mapper(lambda columns: pl.read_parquet(source, columns=columns), groups))
        columns = [column for part in parts for column in part.get_columns()]
        return pl.DataFrame(columns).select(list(schema))
    except Exception:  # noqa: BLE001 - the plain read below reports it
        return pl.read_parquet(source)
