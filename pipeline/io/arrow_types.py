"""Arrow types a Parquet or Arrow IPC file may declare that Polars cannot take: Polars
panics (a BaseException that would end the whole run) or fails on them, so a file's
schema is checked for them before Polars sees its bytes."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.types as pat


class UnsupportedType(ValueError):
    """A file declares an Arrow type Polars cannot read."""


def _unsupported(dtype: pa.DataType) -> bool:
    return (
        pat.is_list_view(dtype)
        or pat.is_large_list_view(dtype)
        or pat.is_run_end_encoded(dtype)
        or pat.is_union(dtype)
        or pat.is_interval(dtype)
        or pat.is_decimal256(dtype)
    )


def _children(dtype: pa.DataType) -> list[pa.DataType]:
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


def check_schema(schema: pa.Schema) -> None:
    if (problem := unsupported_type(schema)) is not None:
        raise UnsupportedType(problem)
