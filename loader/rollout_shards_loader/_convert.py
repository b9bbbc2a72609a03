"""Converting a rank file's columns into what a trainer holds: Python lists of the values
(float32 as the Python float of the float32 value), or numpy (`Ragged` for list columns)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa


class Ragged(NamedTuple):
    """A ragged column with `as_numpy=True`: row i is `values[offsets[i]:offsets[i + 1]]`.

    `offsets` is int64 of length rows + 1, starting at 0; `valid` is None when no row is
    null, else a bool array (False: the row is null; its slice holds no data)."""

    values: np.ndarray
    offsets: np.ndarray
    valid: np.ndarray | None = None

    def tolist(self, null_empty: bool = False) -> list[Any]:
        """The rows as Python lists (null rows None, or [] with `null_empty`), the same
        values `read_rank` gives without `as_numpy`."""
        if self.values.dtype == object:  # strings: one flat list, sliced per row
            flat = self.values.tolist()
            bounds = self.offsets.tolist()
            rows: list[Any] = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        else:  # each piece converts in C, where slicing a flat list runs per value in Python
            pieces = np.split(self.values, self.offsets[1:-1])
            rows = [piece.tolist() for piece in pieces] if len(self.offsets) > 1 else []
        if self.valid is not None:
            for i in np.flatnonzero(~self.valid).tolist():
                rows[i] = [] if null_empty else None
        return rows


def is_list(column: pa.ChunkedArray) -> bool:
    return pa.types.is_list(column.type) or pa.types.is_large_list(column.type)


def scalar_array(column: pa.ChunkedArray) -> np.ndarray:
    """A scalar column as numpy (one chunk is zero-copy; nulls become NaN / None)."""
    if column.num_chunks == 1:
        return column.chunk(0).to_numpy(zero_copy_only=False)
    return column.to_numpy()


def scalars(column: pa.ChunkedArray) -> list[Any]:
    """A scalar column as a Python list (nulls None)."""
    if column.null_count:
        return column.to_pylist()
    return scalar_array(column).tolist()


def ragged(column: pa.ChunkedArray) -> Ragged:
    """A list column as its flat values (numpy, one conversion) and row offsets."""
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not pa.types.is_list(array.type) and not pa.types.is_large_list(array.type):
        raise TypeError(f"expected a list column, got {array.type}")
    offsets = array.offsets.to_numpy().astype(np.int64, copy=False)
    start, end = int(offsets[0]), int(offsets[-1])
    values = array.values.slice(start, end - start).to_numpy(zero_copy_only=False)
    valid = None
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False)
    return Ragged(values, offsets - start if start else offsets, valid)


def lists(column: pa.ChunkedArray, null_empty: bool = False) -> list[Any]:
    """A list column as Python lists: the flat values as numpy, cut at the row offsets,
    each piece's `tolist`. A null row is None, or an empty list with `null_empty`."""
    return ragged(column).tolist(null_empty)


def optional_ints(column: pa.ChunkedArray, as_numpy: bool) -> Any:
    """An integer column with nulls: a Python list (None where null), or an int32 masked
    array masked where null."""
    if not as_numpy:
        return column.to_pylist()
    array = column.combine_chunks()
    values = array.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    return np.ma.MaskedArray(values, mask=array.is_null().to_numpy(zero_copy_only=False))
