"""`rollout-shards parity A B`: where two payloads part, field by field and bitwise.

Two builds (output roots or step folders) are keyed by (step, batch_position); two
sample-table inputs (anything the readers load) by (step, index, leaf). Floats compare
by their bit patterns, so -0.0 differs from 0.0 and NaN equals NaN only with the same
bits; lists compare element-wise, nulls differ from values, and rows or columns present
on one side only are differences too. This is the check miles' v1/v2 parity test makes
on a training payload (PR #2536: `rollout_id` None on one path, 0 on the other).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

from pipeline import columns as c
from pipeline.columns import IN_LEFT, IN_RIGHT, INPUT_POSITION, OCCURRENCE, PATH_STEP, RANK_POSITION
from pipeline.errors import StepError, UsageError, Violation
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps, load_step, read_table
from pipeline.manifest import MANIFEST

BUILD_KEYS: tuple[str, ...] = (c.STEP, c.BATCH_POSITION)
INPUT_KEYS: tuple[str, ...] = (c.STEP, c.INDEX, c.LEAF)
PROVENANCE = (c.SOURCE_FILE, c.SOURCE_ROW, PATH_STEP)

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


@dataclass
class ParityReport:
    mode: str  # "builds" or "inputs"
    keys: tuple[str, ...]
    left: str
    right: str
    rows_left: int
    rows_right: int
    only_left: int
    only_right: int
    row_examples: list[dict[str, Any]]  # {"side", "key"}
    columns: list[ColumnDiff]
    notes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.columns and not self.only_left and not self.only_right

    def summary(self) -> str:
        if self.identical:
            return "identical"
        one_sided = self.only_left + self.only_right
        rows = f", {one_sided} rows on one side only" if one_sided else ""
        return f"{len(self.columns)} columns differ{rows}"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = _jsonable(
            {
                "mode": self.mode,
                "keys": list(self.keys),
                "left": self.left,
                "right": self.right,
                "rows": {
                    "left": self.rows_left,
                    "right": self.rows_right,
                    "only_left": self.only_left,
                    "only_right": self.only_right,
                    "examples": self.row_examples,
                },
                "columns": [column.__dict__ for column in self.columns],
                "notes": self.notes,
                "identical": self.identical,
                "summary": self.summary(),
            }
        )
        return data

    def text(self) -> str:
        lines = [
            f"parity of {self.mode}: left {self.left} ({self.rows_left} rows), "
            f"right {self.right} ({self.rows_right} rows), keyed by ({', '.join(self.keys)})"
        ]
        lines += [f"note: {note}" for note in self.notes]
        if self.only_left or self.only_right:
            lines.append(f"rows: {self.only_left} only in left, {self.only_right} only in right")
            lines += [f"  only in {ex['side']}: {_show_key(ex['key'])}" for ex in self.row_examples]
        matched = self.rows_left - self.only_left
        for column in self.columns:
            lines.append(_column_header(column, matched))
            lines += [f"  {_show_example(column, ex)}" for ex in column.examples]
        lines.append(self.summary())
        return "\n".join(lines)


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


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _show_key(key: dict[str, Any]) -> str:
    return ", ".join(f"{name} {_show(value)}" for name, value in key.items())


def _show_side(example: dict[str, Any], side: str) -> str:
    if side not in example:
        return f"{side} (absent)"
    text = f"{side} {_show(example[side])}"
    if side + "_bits" in example:
        text += f" ({example[side + '_bits']})"
    length = example.get(side + "_length")
    if length is not None and "element" not in example and length > PREVIEW:
        text = text[:-1] + f", ...] (length {length})"
    return text


def _show_example(column: ColumnDiff, example: dict[str, Any]) -> str:
    where = _show_key(example["key"])
    if "element" in example:
        where += (
            f", element {example['element']} (lengths {example['left_length']}"
            f" and {example['right_length']})"
        )
    return f"{where}: {_show_side(example, 'left')}, {_show_side(example, 'right')}"


def _column_header(column: ColumnDiff, matched: int) -> str:
    if column.kind == "only_left":
        return f"column {column.column}: only in left ({column.rows} rows)"
    if column.kind == "only_right":
        return f"column {column.column}: only in right ({column.rows} rows)"
    if column.kind in ("absent_left", "absent_right"):
        side = column.kind.removeprefix("absent_")
        return (
            f"column {column.column}: absent in {side} (read as null), "
            f"{column.rows} of {matched} rows differ"
        )
    if column.kind == "type":
        return (
            f"column {column.column}: type differs, left {column.left_type}, right "
            f"{column.right_type} ({column.rows} rows)"
        )
    return f"column {column.column}: {column.rows} of {matched} rows differ"


def _jsonable(value: Any) -> Any:
    """Plain JSON: non-finite floats as strings ("nan", "-inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def is_build(path: Path) -> bool:
    """An output root (step=<N>/manifest.json folders) or one step folder (manifest.json)."""
    if not path.is_dir():
        return False
    if (path / MANIFEST).is_file():
        return True
    return any(p.is_file() for p in path.glob(f"step=*/{MANIFEST}"))


def _step_folders(path: Path, notes: list[str]) -> list[Path]:
    if (path / MANIFEST).is_file():
        return [path]
    folders = []
    for folder in sorted(path.glob("step=*"), key=str):
        if not folder.is_dir():
            continue
        if (folder / MANIFEST).is_file():
            folders.append(folder)
        else:
            notes.append(f"{folder}: no {MANIFEST} (an incomplete step), not compared")
    return folders


def _manifest_step(folder: Path) -> int:
    manifest = folder / MANIFEST
    try:
        return int(json.loads(manifest.read_text())[c.STEP])
    except (ValueError, KeyError, TypeError) as exc:
        reason = f"not a step manifest ({type(exc).__name__}: {exc})"
        raise StepError(
            [Violation(rule="unreadable_file", message=reason, files=[str(manifest)])]
        ) from exc


def _rank_of(path: Path) -> int:
    return int(path.stem.removeprefix("rank="))


def read_build(path: Path, notes: list[str]) -> pl.DataFrame:
    """Every shard row of a build with its step, rank and position in the rank's file."""
    frames = []
    for folder in _step_folders(path, notes):
        step = _manifest_step(folder)
        for shard in sorted(folder.glob("rank=*.parquet"), key=_rank_of):
            frames.append(
                read_table(shard, step).with_columns(
                    pl.lit(step, dtype=pl.Int64).alias(c.STEP),
                    pl.lit(_rank_of(shard), dtype=pl.Int32).alias(c.RANK),
                    pl.int_range(pl.len(), dtype=pl.Int64).alias(RANK_POSITION),
                )
            )
    if not frames:
        raise UsageError(f"{path}: no shard files in its step folders")
    return pl.concat(frames, how="diagonal_relaxed")


def read_inputs(path: Path, notes: list[str]) -> tuple[pl.DataFrame, list[str]]:
    """Every row of a sample-table input as the pipeline reads it (typed to the contract),
    with its position in its step's batch order; and the columns the reader ignores."""
    found: list[str] = []
    steps = group_steps(find_sources([path], notes=found))
    notes.extend(f"{path}: {note}" for note in found)
    if not steps:
        raise UsageError(f"no rollout tables or builds found under {path}")
    frames, ignored = [], set()
    for step, sources in steps.items():
        loaded = load_step(step, sources)
        ignored.update(loaded.ignored_columns)
        frames.append(
            loaded.frame.drop(PROVENANCE, strict=False).with_columns(
                pl.int_range(pl.len(), dtype=pl.Int64).alias(INPUT_POSITION)
            )
        )
    return pl.concat(frames, how="diagonal_relaxed"), sorted(ignored)


def parity(a: str | Path, b: str | Path, limit: int = EXAMPLES) -> ParityReport:
    """Compare two builds, or two sample-table inputs; mixing the two is a usage error."""
    left_path, right_path = Path(a), Path(b)
    for path in (left_path, right_path):
        if not path.exists():
            raise UsageError(f"{path} does not exist")
    kinds = [is_build(left_path), is_build(right_path)]
    if kinds[0] != kinds[1]:
        build, other = (left_path, right_path) if kinds[0] else (right_path, left_path)
        raise UsageError(
            f"cannot compare a build ({build}) with sample-table inputs ({other}); "
            "give two output roots or step folders, or two inputs"
        )
    notes: list[str] = []
    if kinds[0]:
        mode, keys = "builds", BUILD_KEYS
        left, right = read_build(left_path, notes), read_build(right_path, notes)
    else:
        mode, keys = "inputs", INPUT_KEYS
        left, left_ignored = read_inputs(left_path, notes)
        right, right_ignored = read_inputs(right_path, notes)
        if left_ignored or right_ignored:
            notes.append(
                "columns the pipeline ignores, not compared: left "
                f"{', '.join(left_ignored) or '-'}; right {', '.join(right_ignored) or '-'}"
            )
    # An input column the contract allows to be null reads as nulls when absent.
    nullable = c.INPUT_SCHEMA if mode == "inputs" else None
    columns, rows = compare_frames(left, right, keys, limit, nullable)
    return ParityReport(
        mode=mode,
        keys=keys,
        left=str(left_path),
        right=str(right_path),
        rows_left=left.height,
        rows_right=right.height,
        only_left=rows["only_left"],
        only_right=rows["only_right"],
        row_examples=rows["examples"],
        columns=columns,
        notes=notes,
    )
