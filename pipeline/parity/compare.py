"""Where two frames part, field by field and bitwise.

Rows pair by their keys (and, for a key given twice, by its order of occurrence); floats
compare by their bit patterns, so -0.0 differs from 0.0 and NaN equals NaN only with the
same bits; lists compare element-wise, nulls differ from values, and rows or columns
present on one side only are differences too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

from pipeline.columns import IN_LEFT, IN_RIGHT, OCCURRENCE
from pipeline.errors import UsageError

LEFT = "left:"
RIGHT = "right:"
DIFF = "diff:"

FLOAT_BITS: dict[PolarsDataType, PolarsDataType] = {
    pl.Float16(): pl.UInt16(),
    pl.Float32(): pl.UInt32(),
    pl.Float64(): pl.UInt64(),
}
EXAMPLES = 5
PREVIEW = 8


@dataclass
class ColumnDiff:
    """One differing column: `values` differ on matched rows, its `type` differs, it is
    `only_left`/`only_right`, or it is `absent_left`/`absent_right` where an absent column
    reads as nulls (a nullable input column), its values compared against those nulls."""

    column: str
    kind: str
    rows: int
    left_type: str | None = None
    right_type: str | None = None
    examples: list[dict[str, Any]] = field(default_factory=list)


def float_bits(expr: pl.Expr, dtype: PolarsDataType) -> pl.Expr:
    """The expression with every float, also inside lists and structs, as its raw bits."""
    if dtype in FLOAT_BITS:
        return expr.reinterpret(dtype=FLOAT_BITS[dtype])
    if isinstance(dtype, pl.Array):
        return float_bits(expr.cast(pl.List(dtype.inner)), pl.List(dtype.inner))
    if isinstance(dtype, pl.List) and _has_float(dtype.inner):
        return expr.list.eval(float_bits(pl.element(), dtype.inner))
    if isinstance(dtype, pl.Struct) and _has_float(dtype):
        fields = [
            float_bits(expr.struct.field(f.name), f.dtype).alias(f.name) for f in dtype.fields
        ]
        # Rebuilding the struct would turn a null struct into a struct of nulls.
        return pl.when(expr.is_not_null()).then(pl.struct(fields))
    return expr


def _has_float(dtype: PolarsDataType) -> bool:
    if dtype in FLOAT_BITS:
        return True
    if isinstance(dtype, pl.List | pl.Array):
        return _has_float(dtype.inner)
    if isinstance(dtype, pl.Struct):
        return any(_has_float(f.dtype) for f in dtype.fields)
    return False


def _tagged(frame: pl.DataFrame, keys: Sequence[str], prefix: str, marker: str) -> pl.LazyFrame:
    return frame.lazy().select(
        *keys,
        pl.int_range(pl.len(), dtype=pl.UInt32).over(keys).alias(OCCURRENCE),
        pl.lit(True).alias(marker),
        *(pl.col(name).alias(prefix + name) for name in frame.columns if name not in keys),
    )


def _diff_expr(name: str, left: pl.Schema, right: pl.Schema) -> tuple[str, pl.Expr]:
    """The column's kind of difference and a per-row mask of where it differs."""
    both = pl.col(IN_LEFT) & pl.col(IN_RIGHT)
    if name not in right:
        return "only_left", pl.col(IN_LEFT)
    if name not in left:
        return "only_right", pl.col(IN_RIGHT)
    if left[name] != right[name]:
        return "type", both
    same = float_bits(pl.col(LEFT + name), left[name]).eq_missing(
        float_bits(pl.col(RIGHT + name), right[name])
    )
    return "values", both & ~same


def compare_frames(
    left: pl.DataFrame,
    right: pl.DataFrame,
    keys: Sequence[str],
    limit: int = EXAMPLES,
    nullable: Mapping[str, pl.DataType] | None = None,
) -> tuple[list[ColumnDiff], dict[str, Any]]:
    """Per differing column its count and first `limit` examples (lowest keys first), and
    the rows present on one side only. A `nullable` column absent on one side is read
    there as nulls of its type, so its values are still pinpointed."""
    for side, frame in (("left", left), ("right", right)):
        missing = [key for key in keys if key not in frame.columns]
        if missing:
            raise UsageError(f"the {side} side has no {', '.join(missing)} column to key rows by")
    names = [n for n in dict.fromkeys([*left.columns, *right.columns]) if n not in keys]
    schemas = {"left": left.schema, "right": right.schema}
    # Keys of another type still pair rows; the type difference is reported on its own.
    key_types = [key for key in keys if left.schema[key] != right.schema[key]]
    left = left.with_columns(pl.col(key_types).cast(pl.Int64, strict=False))
    right = right.with_columns(pl.col(key_types).cast(pl.Int64, strict=False))
    types = nullable or {}
    absent: dict[str, str] = {}
    for name in names:
        if name in types and name not in left.schema:
            absent[name] = "left"
            left = left.with_columns(pl.lit(None, dtype=types[name]).alias(name))
        elif name in types and name not in right.schema:
            absent[name] = "right"
            right = right.with_columns(pl.lit(None, dtype=types[name]).alias(name))
    kinds, masks = {}, []
    for name in names:
        kinds[name], mask = _diff_expr(name, left.schema, right.schema)
        if name in absent:
            kinds[name] = f"absent_{absent[name]}"
        masks.append(mask.alias(DIFF + name))
    joined = (
        _tagged(left, keys, LEFT, IN_LEFT)
        .join(
            _tagged(right, keys, RIGHT, IN_RIGHT),
            on=[*keys, OCCURRENCE],
            how="full",
            coalesce=True,
            nulls_equal=True,
        )
        .with_columns(pl.col(IN_LEFT, IN_RIGHT).fill_null(False))
        .with_columns(masks)
        .collect()
    )
    order = [*keys, OCCURRENCE]
    counts = joined.select(
        (~pl.col(IN_RIGHT)).sum().alias(IN_LEFT),
        (~pl.col(IN_LEFT)).sum().alias(IN_RIGHT),
        *(pl.col(DIFF + name).sum().alias(name) for name in names),
    ).row(0, named=True)
    one_sided = (
        joined.filter(~(pl.col(IN_LEFT) & pl.col(IN_RIGHT)))
        .select(*order, IN_LEFT)
        .sort(order, nulls_last=True)
        .head(limit)
    )
    rows = {
        "only_left": counts[IN_LEFT],
        "only_right": counts[IN_RIGHT],
        "examples": [
            {"side": "left" if row[IN_LEFT] else "right", "key": _key(row, order)}
            for row in one_sided.iter_rows(named=True)
        ],
    }
    diffs = [
        ColumnDiff(
            column=key,
            kind="type",
            rows=joined.height,
            left_type=str(schemas["left"][key]),
            right_type=str(schemas["right"][key]),
        )
        for key in key_types
    ]
    for name in names:
        if not counts[name] and name not in absent:
            continue
        diff = ColumnDiff(
            column=name,
            kind=kinds[name],
            rows=counts[name],
            left_type=str(schemas["left"][name]) if name in schemas["left"] else None,
            right_type=str(schemas["right"][name]) if name in schemas["right"] else None,
        )
        first = joined.filter(pl.col(DIFF + name)).sort(order, nulls_last=True).head(limit)
        diff.examples = _examples(first, order, diff, left.schema, right.schema)
        diffs.append(diff)
    return diffs, rows


def _examples(
    rows: pl.DataFrame,
    order: Sequence[str],
    diff: ColumnDiff,
    left: pl.Schema,
    right: pl.Schema,
) -> list[dict[str, Any]]:
    """The example rows as plain values: key, left and right, and the bits of floats."""
    name = diff.column
    sides = [
        (side, prefix, schema)
        for side, prefix, schema in (("left", LEFT, left), ("right", RIGHT, right))
        if name in schema
    ]
    exprs = [pl.col(*order)]
    for side, prefix, schema in sides:
        exprs.append(pl.col(prefix + name).alias(side))
        if diff.kind != "type" and _has_float(schema[name]):
            exprs.append(float_bits(pl.col(prefix + name), schema[name]).alias(side + "_bits"))
    width = {side: _bit_width(schema[name]) for side, _, schema in sides}
    pointwise = diff.kind in ("values", "absent_left", "absent_right")
    return [
        _example(row, order, width, pointwise) for row in rows.select(exprs).iter_rows(named=True)
    ]


def _bit_width(dtype: PolarsDataType) -> int | None:
    while isinstance(dtype, pl.List | pl.Array):
        dtype = dtype.inner
    widths: dict[PolarsDataType, int] = {pl.Float16(): 16, pl.Float32(): 32, pl.Float64(): 64}
    return widths.get(dtype)


def _key(row: dict[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """The row's key; the occurrence only for a duplicated key, as `duplicate`."""
    key = {k: row[k] for k in order if k != OCCURRENCE}
    if row.get(OCCURRENCE):
        key["duplicate"] = row[OCCURRENCE]
    return key


def _example(
    row: dict[str, Any], order: Sequence[str], width: dict[str, int | None], pointwise: bool
) -> dict[str, Any]:
    example: dict[str, Any] = {"key": _key(row, order)}
    left, right = row.get("left"), row.get("right")
    lbits, rbits = row.get("left_bits"), row.get("right_bits")
    if pointwise and isinstance(left, list) and isinstance(right, list):
        at = _first_difference(
            lbits if lbits is not None else left, rbits if rbits is not None else right
        )
        example["element"] = at
        example["left_length"], example["right_length"] = len(left), len(right)
        left, right = _at(left, at), _at(right, at)
        lbits, rbits = _at(lbits, at), _at(rbits, at)
    for side, value, bits in (("left", left, lbits), ("right", right, rbits)):
        if side not in row:
            continue
        if isinstance(value, list):
            example[side + "_length"] = len(value)
            value = value[:PREVIEW]
        example[side] = value
        bit_width = width[side]
        if (
            isinstance(value, float)
            and isinstance(bits, int)
            and bit_width is not None
            and _same_looking(left, right)
        ):
            example[side + "_bits"] = f"0x{bits:0{bit_width // 4}x}"
    return example


def _first_difference(left: list[Any], right: list[Any]) -> int:
    for position, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            return position
    return min(len(left), len(right))


def _at(values: list[Any] | None, position: int) -> Any:
    return values[position] if values is not None and position < len(values) else None


def _same_looking(left: Any, right: Any) -> bool:
    """Floats that compare equal (0.0 and -0.0) or are both NaN differ only in their bits."""
    if not (isinstance(left, float) and isinstance(right, float)):
        return False
    return left == right or (math.isnan(left) and math.isnan(right))
