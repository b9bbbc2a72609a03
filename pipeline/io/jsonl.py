"""JSON Lines: a file's bytes as a DataFrame, each value of the wrong JSON kind and each
key given twice flagged on its row (docs/bad-data.md, "JSON Lines")."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import polars as pl

from pipeline import columns as c
from pipeline.columns import JSON_RULE, JSON_VALUE
from pipeline.io.conform import JSON_TEXT_COLUMNS, dtype_kind

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

# A JSON object key as written, escapes and all, with the colon after it.
KEY_TOKEN = r'"(?:[^"\\]|\\.)*"\s*:'
# A JSON string as written.
STRING = r'"(?:[^"\\]|\\.)*"'


class JsonLinesError(ValueError):
    """A line that is not a JSON object, or a key whose JSON kind changes between lines."""


def json_kind(dtype: PolarsDataType) -> str:
    """The JSON kind Polars inferred a column as: `dtype_kind`'s, with every number one
    kind (JSON has no integers apart)."""
    kind = dtype_kind(dtype)
    return "number" if kind in ("int", "float") or dtype.is_numeric() else kind


def _json_kind_of_target(target: PolarsDataType) -> str:
    if isinstance(target, pl.List):
        return "list of " + _json_kind_of_target(target.inner)
    if isinstance(target, pl.Struct):
        return "struct"
    if target == pl.Boolean:
        return "bool"
    return "number" if target.is_numeric() else "string"


# The type each typed column takes, and its JSON kind; prompt, metadata and
# train_metadata take any.
JSON_TYPES = {
    name: dtype
    for name, dtype in {**c.INPUT_SCHEMA, c.REWARD: pl.Float64()}.items()
    if name not in JSON_TEXT_COLUMNS
}
JSON_TARGETS = {name: _json_kind_of_target(dtype) for name, dtype in JSON_TYPES.items()}


def _value_kind(value: object) -> str:
    if isinstance(value, dict):
        return "object"
    return "array" if isinstance(value, list) else "scalar"


def _value_name(value: object) -> str:
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "an array"
    if isinstance(value, bool):
        return "a boolean"
    return "a string" if isinstance(value, str) else "a number"


def _misfits(value: object, target: PolarsDataType) -> bool:
    """A JSON value that does not have its column's type, which Python or Polars would
    coerce silently or refuse for the whole file: true or "0" where a number belongs,
    ["11"] or "1,1" where a list of numbers belongs, 1 or "false" where a boolean belongs,
    a number where a string belongs, an object whose keys are not its struct's fields."""
    if value is None:
        return False
    if isinstance(target, pl.List):
        return not isinstance(value, list) or any(_misfits(v, target.inner) for v in value)
    if isinstance(target, pl.Struct):
        names = [f.name for f in target.fields]
        return (
            not isinstance(value, dict)
            or set(value) != set(names)
            or any(_misfits(value[f.name], f.dtype) for f in target.fields)
        )
    if target == pl.Boolean:
        return not isinstance(value, bool)
    if target.is_numeric():
        return isinstance(value, bool) or not isinstance(value, int | float)
    return not isinstance(value, str)


def _flag_misfits(record: dict[str, Any]) -> dict[str, Any]:
    for key, target in JSON_TYPES.items():
        value = record.get(key)
        # an object as reward is a struct reward (read through reward_key)
        if _misfits(value, target) and not (key == c.REWARD and isinstance(value, dict)):
            record.setdefault(JSON_RULE + key, "column_type")
            record[JSON_VALUE + key] = json.dumps(value)
            record[key] = None
    return record


def _holds(value: object, repeated: dict[int, list[str]]) -> str | None:
    """The first key given twice in an object nested anywhere in `value`."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if id(item) in repeated:
                return repeated[id(item)][0]
            pending += item.values()
        elif isinstance(item, list):
            pending += item
    return None


def _key_name(key: str) -> str:
    """A key as a message names it: as written when a plain name, else as JSON text
    (an empty key is `""`)."""
    return key if key.isidentifier() else json.dumps(key)


def _parse_line(line: bytes) -> object:
    """One line as JSON. A key given twice in any object is flagged on the line's record:
    under JSON_RULE (`duplicate_key`) of the top-level key holding it, and under JSON_VALUE
    the key as the message names it. The first value stays, so the row keeps its index."""
    repeated: dict[int, list[str]] = {}

    def pairs(items: list[tuple[str, object]]) -> dict[str, Any]:
        record: dict[str, Any] = {}
        for key, value in items:
            if key in record:
                repeated.setdefault(id(record), []).append(key)
                continue
            record[key] = value
        return record

    record = json.loads(line, object_pairs_hook=pairs)
    if not isinstance(record, dict) or not repeated:
        return record
    flags: dict[str, Any] = {}
    for key in repeated.get(id(record), []):
        flags[JSON_RULE + key] = "duplicate_key"
        flags[JSON_VALUE + key] = _key_name(key)
    for key, value in record.items():
        nested = _holds(value, repeated)
        if nested is not None and JSON_RULE + key not in flags:
            flags[JSON_RULE + key] = "duplicate_key"
            flags[JSON_VALUE + key] = f"{_key_name(nested)} inside {_key_name(key)}"
    return {**record, **flags}


def _json_objects(data: bytes) -> list[dict[str, Any]]:
    """Every line as a JSON object, or JsonLinesError naming the first line that is not
    one. A value of the wrong JSON kind, or a key given twice, is set to null and its
    rule and text kept under JSON_RULE/JSON_VALUE keys, for `conform` to report as that
    row's."""
    records = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = _parse_line(line)
        except ValueError as exc:
            reason = getattr(exc, "msg", str(exc))
            raise JsonLinesError(f"line {number} is not a JSON object ({reason})") from None
        if not isinstance(record, dict):
            kind = type(record).__name__
            raise JsonLinesError(f"line {number} is not a JSON object (a {kind})")
        records.append((number, _flag_misfits(record)))
    first: dict[str, tuple[int, object]] = {}
    for number, record in records:
        for key, value in record.items():
            if value is None or key.startswith((JSON_RULE, JSON_VALUE)):
                continue
            seen = first.setdefault(key, (number, value))
            if _value_kind(seen[1]) != _value_kind(value):
                raise JsonLinesError(
                    f"line {number}: {key} is {_value_name(value)} where line {seen[0]} has "
                    f"{_value_name(seen[1])}"
                )
    return [record for _, record in records]


def _not_text_pattern() -> str:
    """A typed text key followed by a value that is not text (nor null), or a list of
    text holding something else: Polars would read the number as text."""
    text = [name for name, kind in JSON_TARGETS.items() if kind == "string"]
    lists = [name for name, kind in JSON_TARGETS.items() if kind == "list of string"]
    scalar = rf'"(?:{"|".join(text)})"\s*:\s*[^"\sn]'
    listed = rf'"(?:{"|".join(lists)})"\s*:\s*\[\s*(?:{STRING}\s*,\s*)*[^"\s\]]'
    return f"{scalar}|{listed}"


NOT_TEXT = _not_text_pattern()


def _values_under(value: pl.Expr, dtype: PolarsDataType) -> pl.Expr | None:
    """Per row, how many keys of the objects inside `value` (at any depth, in arrays
    too) hold a value that is not null; None when `dtype` holds no object."""
    if isinstance(dtype, pl.Struct):
        parts: list[pl.Expr] = []
        for field in dtype.fields:
            held = value.struct.field(field.name)
            parts.append(held.is_not_null().cast(pl.UInt32))
            if (inner := _values_under(held, field.dtype)) is not None:
                parts.append(inner)
        return pl.sum_horizontal(parts).fill_null(0) if parts else None
    if isinstance(dtype, pl.List | pl.Array):
        inner = _values_under(pl.element(), dtype.inner)
        return None if inner is None else value.list.eval(inner).list.sum().fill_null(0)
    return None


def _keys_read(frame: pl.DataFrame) -> pl.Series:
    """Per row, how many keys with a value that is not null Polars read, at any depth."""
    parts: list[pl.Expr] = []
    for name, dtype in frame.schema.items():
        parts.append(pl.col(name).is_not_null().cast(pl.UInt32))
        if (inner := _values_under(pl.col(name), dtype)) is not None:
            parts.append(inner)
    return frame.select(pl.sum_horizontal(parts).cast(pl.Int64)).to_series()


def _suspect(data: bytes, frame: pl.DataFrame) -> bool:
    """Whether Polars' reading may have coerced a value or dropped one: a typed column
    that Polars read as another kind (strings or booleans where numbers belong), a text
    column's key followed by a number, or a line giving a key twice at any depth (Polars
    keeps one of them). Such files take the per-line path."""
    for name, dtype in frame.schema.items():
        want = JSON_TARGETS.get(name)
        if want is None or (name == c.REWARD and isinstance(dtype, pl.Struct)):
            continue
        if "struct" in want:  # objects' fields checked line by line (`_misfits`)
            return True
        have: PolarsDataType = dtype
        while isinstance(have, pl.List) and want.startswith("list of "):
            have, want = have.inner, want.removeprefix("list of ")
        kind = json_kind(have)
        if kind not in ("null", want):
            return True
    lines = pl.Series(data.decode("utf-8", "replace").split("\n"))
    lines = lines.filter(lines.str.strip_chars() != "")
    if lines.str.contains(NOT_TEXT).any() or lines.len() != frame.height:
        return True
    # A key given twice in one object leaves Polars one value: a line then holds more
    # keys with a value than Polars read. A key-like text inside a string only costs the
    # per-line path, which counts exactly.
    # null is the one JSON value that starts with an n
    written = lines.str.count_matches(KEY_TOKEN + r"\s*[^n\s]")
    if (written.cast(pl.Int64) != _keys_read(frame)).any():
        return True
    return _null_key_given_twice(lines)


def _null_key_given_twice(lines: pl.Series) -> bool:
    """Whether some line may give a key twice with null as one of its values, which the
    count of keys with a value cannot see (`"reward": 1.0, "reward": null`): a key written
    with a null value whose quoted name comes again on its line, or is escaped. Each
    distinct such name is counted over all lines at once (there are few of them)."""
    null_keys = (
        lines.str.extract_all(KEY_TOKEN + r"\s*null")
        .explode()
        .drop_nulls()
        .str.replace(r"\s*:\s*null$", "")
        .unique()
    )
    for key in null_keys:
        if "\\" in key:
            return True
        again = lines.filter(lines.str.count_matches(key, literal=True) > 1)
        if again.str.contains(re.escape(key) + r"\s*:\s*null").any():
            return True
    return False


def read_jsonl(data: bytes) -> pl.DataFrame:
    """A JSON Lines file's bytes. Polars reads it first; a file Polars refuses or may have
    coerced is read again line by line with Python's `json`, which names the offending
    line, flags values of the wrong kind and repeated keys per row, and accepts the NaN
    and Infinity that Python's json.dumps writes (reward_finite rejects them). Raises
    JsonLinesError, or a Polars error for rows Polars cannot hold."""
    try:
        frame = pl.read_ndjson(data, infer_schema_length=None)
        if not _suspect(data, frame):
            return frame
    except pl.exceptions.PolarsError:
        pass
    records = _json_objects(data)
    try:
        return pl.from_dicts(records, infer_schema_length=None)
    except (pl.exceptions.PolarsError, TypeError, ValueError):
        # An array or object that no Polars type holds (`[1, {"a": 2}]`) in a column kept
        # as JSON text: kept as the text Python writes for it, rather than refused.
        return pl.from_dicts([_as_text(record) for record in records], infer_schema_length=None)


def _as_text(record: dict[str, Any]) -> dict[str, Any]:
    return {
        key: json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        if key in JSON_TEXT_COLUMNS and isinstance(value, dict | list)
        else value
        for key, value in record.items()
    }
