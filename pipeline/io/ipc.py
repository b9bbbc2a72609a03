"""Arrow IPC (`.arrow`, `.feather`): a file's bytes as a DataFrame, its columns as stored."""

from __future__ import annotations

import polars as pl


def read_ipc(data: bytes) -> pl.DataFrame:
    return pl.read_ipc(data)
