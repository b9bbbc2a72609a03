"""Conformance to the contract's column types (CONTRACT section 1): each column of a read
file as its contract type, every value that is not of that type named, never cast.

A column stored as the contract's type, or as another width of it (int8 for int64, a
float64 list for float32 log probs), or as integers where floats belong (a reward of 0
or 1), keeps its values where they fit exactly: a token id beyond int32, a log prob
beyond float32 or an integer reward beyond 2**53 is that row's `column_type` violation.
A column stored as another type (strings or a Decimal for numbers, floats for integers,
numbers for strings, integers for a boolean) is a `column_type` violation of every row
holding a value. JSON Lines has one kind of number: there a float with an integer value
where an integer belongs is a number that fits too.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import polars as pl

from pipeline import columns as c
from pipeline.columns import JSON_RULE, JSON_VALUE, TYPE_ERROR
from pipeline.errors import StepError, Violation

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

# Columns kept for people rather than training: a JSON array or object there is kept as
# its JSON text, since miles' `prompt` is often a chat list and `metadata` a dict.
JSON_TEXT_COLUMNS = (c.TRAIN_METADATA, c.PROMPT, c.METADATA)
VALUE_TEXT_CHARS = 60


def dtype_kind(dtype: PolarsDataType) -> str:
    """list, struct, bool, null, int, float, string or other (Decimal, Binary, dates...)."""
    if isinstance(dtype, pl.List | pl.Array):
        return "list"
    if isinstance(dtype, pl.Struct):
        return "struct"
    if dtype == pl.Boolean:
        return "bool"
    if dtype == pl.Null:
        return "null"
    if dtype.is_integer():
        return "int"
    if dtype.is_float():
        return "float"
    return "string" if isinstance(dtype, pl.String | pl.Categorical | pl.Enum) else "other"


def _stored_fits(source: PolarsDataType, target: PolarsDataType, json_numbers: bool) -> bool:
    """Whether a column stored as `source` holds values of the contract type `target`, but
    for their width; with `json_numbers` an integer and a float are both numbers."""
    have, want = dtype_kind(source), dtype_kind(target)
    if have == "null":
        return True
    if want == "list":
        inner = source.inner if isinstance(source, pl.List | pl.Array) else None
        return inner is not None and _stored_fits(inner, target.inner, json_numbers)  # type: ignore[union-attr]
    if want == "struct":  # the same fields in the same order (a reward's are its own)
        return (
            isinstance(source, pl.Struct)
            and [f.name for f in source.fields] == [f.name for f in target.fields]  # type: ignore[union-attr]
            and all(
                _stored_fits(have.dtype, want.dtype, json_numbers)
                for have, want in zip(source.fields, target.fields, strict=True)  # type: ignore[union-attr]
            )
        )
    if want == "float" and have == "int":  # an integer is a number a float can hold
        return True
    if json_numbers and {have, want} <= {"int", "float"}:
        return True
    return have == want


def _fits(value: pl.Expr, source: PolarsDataType, target: PolarsDataType) -> pl.Expr:
    """True where a non-null value of a type that `_stored_fits` converts to the target
    type without loss: 1.5 is not an integer, 1e300 is not a float32, 2**40 is not an
    int32, a list holds no nulls."""
    if isinstance(target, pl.List):
        if not isinstance(source, pl.List | pl.Array):
            return value.is_null()
        inner = source.inner
        value = value.cast(pl.List(inner)) if isinstance(source, pl.Array) else value
        element = pl.element()
        return value.list.eval(
            element.is_not_null() & _fits(element, inner, target.inner)
        ).list.all()
    if source == target:
        return value.is_not_null()
    if isinstance(target, pl.Struct) and isinstance(source, pl.Struct):
        # each field as its own column: a null field passes (the rules judge it)
        fields = [
            value.struct.field(want.name).is_null()
            | _fits(value.struct.field(want.name), have.dtype, want.dtype)
            for have, want in zip(source.fields, target.fields, strict=True)
        ]
        return value.is_not_null() & pl.all_horizontal(fields)
    cast = value.cast(target, strict=False)
    fits = cast.is_not_null()
    if target.is_integer() and source.is_float():
        fits = fits & (value == value.floor())
    elif target.is_float() and source.is_integer():
        fits = fits & (cast.cast(source, strict=False) == value)
    elif target.is_float():
        fits = fits & (cast.is_finite() | ~value.is_finite())
    return fits


def json_text(value: pl.Expr) -> pl.Expr:
    """Any value as its JSON text; null stays null."""
    encoded = pl.struct(value.alias("v")).struct.json_encode()
    return pl.when(value.is_not_null()).then(encoded.str.slice(5).str.strip_suffix("}"))


class Plan(NamedTuple):
    """A column as its contract type, the rows whose value does not fit (None: all fit),
    and the stored type when it is not the contract's (every value is then refused)."""

    cast: pl.Expr
    bad: pl.Expr | None
    stored_as: str | None = None


def _plan(schema: pl.Schema, name: str, target: pl.DataType, json_numbers: bool) -> Plan:
    source = schema[name]
    value = pl.col(name)
    json_kind = dtype_kind(source) in ("list", "struct") and not _holds_binary(source)
    if name in JSON_TEXT_COLUMNS and json_kind:
        return Plan(json_text(value).alias(name), None)
    if not _stored_fits(source, target, json_numbers):
        refused = pl.lit(None, dtype=target).alias(name)
        return Plan(refused, value.is_not_null().alias(name), str(source))
    bad = (value.is_not_null() & ~_fits(value, source, target).fill_null(False)).alias(name)
    return Plan(value.cast(target, strict=False), bad)


def _no_rows(frame: pl.DataFrame) -> pl.Series:
    return pl.repeat(False, frame.height, eager=True)


def _bad_rows(frame: pl.DataFrame, plans: dict[str, Plan]) -> dict[str, pl.Series]:
    """Per planned column, the mask of rows whose value does not fit, in one query."""
    none = _no_rows(frame)
    checks = {name: plan.bad for name, plan in plans.items() if plan.bad is not None}
    found = frame.select(*checks.values())
    return {name: found.get_column(name) if name in checks else none for name in plans}


def _reward_dtype(series: pl.Series) -> pl.DataType:
    if isinstance(series.dtype, pl.Struct):
        return pl.Struct({f.name: pl.Float64() for f in series.dtype.fields})
    return pl.Float64()


def contract_types(frame: pl.DataFrame) -> dict[str, pl.DataType]:
    """The contract type of each contract column, a struct reward's fields as float64."""
    types = dict(c.INPUT_SCHEMA)
    if c.REWARD in frame.columns:
        types[c.REWARD] = _reward_dtype(frame.get_column(c.REWARD))
    return types


def _holds_binary(dtype: PolarsDataType) -> bool:
    """Whether a type is or holds bytes (Polars panics writing them as JSON)."""
    if isinstance(dtype, pl.List | pl.Array):
        return _holds_binary(dtype.inner)
    if isinstance(dtype, pl.Struct):
        return any(_holds_binary(f.dtype) for f in dtype.fields)
    return dtype == pl.Binary


def value_text(frame: pl.DataFrame, name: str, bad: pl.Series) -> str:
    """The first refused value of a column as written (JSON text where it has one; bytes,
    which JSON has no text for, as Python writes them: b'\\x0b')."""
    first = frame.filter(bad).get_column(name).head(1)
    value = first[0]
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no text for NaN or infinity (Polars encodes them as null): named as the
        # line's rows name them, never as a null the file does not hold.
        text = str(value)
    elif _holds_binary(first.dtype):
        text = str(first.to_list()[0])
    else:
        try:
            text = first.to_frame().select(json_text(pl.col(name))).to_series()[0]
        except pl.exceptions.PolarsError:
            text = str(value)
    text = text or "null"
    return text if len(text) <= VALUE_TEXT_CHARS else text[:VALUE_TEXT_CHARS] + "..."


def cast_column(
    frame: pl.DataFrame, name: str, target: pl.DataType, json_numbers: bool
) -> tuple[pl.Expr, pl.Series]:
    """One column as its contract type, and the mask of rows whose value does not fit."""
    plan = _plan(frame.schema, name, target, json_numbers)
    return plan.cast, _bad_rows(frame, {name: plan})[name]


def refuse_not_carried(frame: pl.DataFrame, names: list[str], path: Path, step: int | None) -> None:
    """Fail the step when a column miles trains on but the shards cannot carry
    (`c.NOT_CARRIED`) holds a value: the shards would train otherwise."""
    held = [name for name in names if frame.get_column(name).null_count() < frame.height]
    if held:
        raise StepError(
            [
                Violation(
                    rule="input_not_carried",
                    message=f"column(s) {', '.join(held)} hold values miles trains on (images "
                    "or audio, multi-LoRA adapters), which the shards do not carry: convert "
                    "such steps in miles",
                    step=step,
                    files=[str(path)],
                )
            ]
        )


def conform(
    frame: pl.DataFrame, path: Path, step: int | None, json_numbers: bool = False
) -> tuple[pl.DataFrame, list[str], list[tuple[str, Violation]]]:
    """Cast every contract column to its type. Rows whose values do not fit, or whose
    column is stored as another type, are marked in TYPE_ERROR and named in one
    `column_type` violation per column (their values become null); keys the JSON Lines
    reader flagged as given twice are `duplicate_key` violations. A missing required
    column fails the whole file (StepError). Returns the typed frame, the extra
    (ignored) columns and the violations, each with the column it names."""
    missing = [name for name in c.REQUIRED_COLUMNS if name not in frame.columns]
    if missing:
        raise StepError(
            [
                Violation(
                    rule="missing_column",
                    message=f"required column(s) {', '.join(missing)} missing",
                    step=step,
                    files=[str(path)],
                )
            ]
        )
    types = contract_types(frame)
    schema = frame.schema
    plans = {
        name: _plan(schema, name, types[name], json_numbers) for name in schema if name in types
    }
    internal = [n for n in frame.columns if n.startswith((JSON_RULE, JSON_VALUE))]
    flagged_keys = [n.removeprefix(JSON_RULE) for n in internal if n.startswith(JSON_RULE)]
    cast_columns: list[pl.Expr] = []
    reasons: list[pl.Expr] = []
    violations: list[tuple[str, Violation]] = []
    masks = _bad_rows(frame, plans)
    for name in dict.fromkeys([*plans, *flagged_keys]):
        bad = masks[name] if name in masks else _no_rows(frame)
        if name in plans:
            cast_columns.append(plans[name].cast)
        flagged = _json_flags(frame, name)
        checks = [("column_type", bad)]
        if flagged is not None:
            checks = [
                ("column_type", bad | (flagged == "column_type")),
                ("duplicate_key", flagged == "duplicate_key"),
            ]
        for rule, mask in checks:
            if not mask.any():
                continue
            expected = (
                f"column {name} must be {types[name]}"
                if rule == "column_type"
                else f"key {name} must appear once in each JSON object"
            )
            stored_as = plans[name].stored_as if name in plans else None
            violations.append(
                (name, _row_violation(frame, name, mask, rule, expected, stored_as, path, step))
            )
            reasons.append(pl.when(pl.lit(mask)).then(pl.lit(f"{rule}: {expected}")))
    type_error = (
        pl.concat_str(reasons, separator="; ", ignore_nulls=True).replace("", None)
        if reasons
        else pl.lit(None, dtype=pl.String)
    )
    extra = [
        name
        for name in frame.columns
        if name not in types and name != c.SOURCE_ROW and name not in internal
    ]
    refuse_not_carried(frame, [name for name in extra if name in c.NOT_CARRIED], path, step)
    typed = frame.with_columns(*cast_columns, type_error.alias(TYPE_ERROR)).drop(extra, *internal)
    return typed, extra, violations


def _json_flags(frame: pl.DataFrame, name: str) -> pl.Series | None:
    """Per row, the rule the JSON Lines reader flagged on this key's value ("" where
    none); None when the reader flagged nothing in it (always for Parquet and Arrow)."""
    if JSON_RULE + name in frame.columns:
        return frame.get_column(JSON_RULE + name).cast(pl.String).fill_null("")
    return None


def _row_violation(
    frame: pl.DataFrame,
    name: str,
    mask: pl.Series,
    rule: str,
    expected: str,
    stored_as: str | None,
    path: Path,
    step: int | None,
) -> Violation:
    """One rule broken by values of one column, naming the first file row and its value."""
    rows = frame.filter(mask)
    first_row = int(rows.get_column(c.SOURCE_ROW)[0]) + 1 if c.SOURCE_ROW in rows else None
    where = f" at file row {first_row}" if first_row is not None else ""
    original = rows.get_column(JSON_VALUE + name)[0] if JSON_VALUE + name in rows.columns else None
    if rule == "duplicate_key":
        key = original if original is not None else name
        message = f"key {key} must appear once in each JSON object, but it is given twice{where}"
    elif stored_as is not None:
        held = f"; file row {first_row} holds" if first_row is not None else "; it holds"
        text = value_text(frame, name, mask)
        message = f"{expected}, but the file stores it as {stored_as}{held} {text}"
    else:
        text = original if original is not None else value_text(frame, name, mask)
        message = f"{expected}, got {text}{where}"
    return Violation(
        rule=rule,
        message=message,
        step=step,
        files=[str(path)],
        rows=index_leaf_pairs(rows),
        n_rows=rows.height,
    )


# The (index, leaf) pairs a violation names; the others are counted.
ROWS_NAMED = 5


def index_leaf_pairs(rows: pl.DataFrame, limit: int = ROWS_NAMED) -> list[tuple[int, int]]:
    index = rows.get_column(c.INDEX).head(limit) if c.INDEX in rows.columns else None
    leaf = rows.get_column(c.LEAF).head(limit) if c.LEAF in rows.columns else None
    if index is None:
        return []
    leaves = leaf.to_list() if leaf is not None else [None] * index.len()
    return list(zip(index.to_list(), leaves, strict=True))
