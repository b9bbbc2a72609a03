"""Parquet: a file's bytes as a DataFrame, its columns as the file stores them."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import polars as pl

# Below this size four reads (each parsing the footer) on a pool cost more than the second
# core saves (bench/results/).
SPLIT_READ_BYTES = 4 << 20


def read_parquet(data: bytes) -> pl.DataFrame:
    """A Parquet file's bytes, its list columns each decoded on a thread of its own.

    Polars decodes a row group's columns one after another, and writers such as pyarrow
    put a whole step in one row group, so a plain read keeps one core busy; the list
    columns hold nearly all the bytes. Any failure of the split read falls back to a plain
    read, whose error is the one to report."""
    if len(data) < SPLIT_READ_BYTES:
        return pl.read_parquet(data)
    try:
        schema = pl.read_parquet_schema(data)
        lists = [name for name, dtype in schema.items() if isinstance(dtype, pl.List)]
        rest = [name for name in schema if name not in lists]
        groups = [[name] for name in lists] + ([rest] if rest else [])
        if len(groups) < 2:
            return pl.read_parquet(data)
        workers = min(len(groups), os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(lambda columns: pl.read_parquet(data, columns=columns), groups))
        columns = [column for part in parts for column in part.get_columns()]
        return pl.DataFrame(columns).select(list(schema))
    except Exception:  # noqa: BLE001 - the plain read below reports it
        return pl.read_parquet(data)
