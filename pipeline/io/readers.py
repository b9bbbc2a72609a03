"""Readers: find the steps under input paths and load a step's rows in batch order."""

from __future__ import annotations

import itertools
import json
import os
import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

from pipeline import columns as c
from pipeline.columns import JSON_RULE, JSON_VALUE, PATH_STEP, TYPE_ERROR
from pipeline.errors import StepError, UsageError, Violation, first_line
from pipeline.io import checksums
from pipeline.io.checksums import sha256_of
from pipeline.io.miles_dump import find_miles_dumps, is_miles_dump, read_miles_dump

# Set once a read leaves a core free: a Parquet read's decoding threads have no column
# group left to start and one of them is done, or a step's files are all read. Work that
# would only slow the decoders waits for it (`step.ingest.importing_the_plan`).
core_free = threading.Event()
TABLE_SUFFIXES = {".parquet": "parquet", ".arrow": "ipc", ".feather": "ipc", ".jsonl": "jsonl"}
STEP_NAME = re.compile(r"^step=(\d+)(\.[a-z]+)?$")
# Columns kept for people rather than training: a JSON array or object there is kept as
# its JSON text, since miles' `prompt` is often a chat list and `metadata` a dict.
JSON_TEXT_COLUMNS = (c.TRAIN_METADATA, c.PROMPT, c.METADATA)
VALUE_TEXT_CHARS = 60


@dataclass(frozen=True)
class SourceFile:
    path: Path
    step: int | None  # from the path; None when only the `step` column tells
    kind: str = "table"  # or "miles": a miles `--dump-details` .pt file
    session_version: str | None = None  # overrides a miles dump's inferred session version


@dataclass
class LoadedStep:
    """A step's rows in batch order with provenance, before validation."""

    step: int
    frame: pl.DataFrame
    files: list[dict[str, Any]] = field(default_factory=list)  # path, rows
    # Each file's sha256, still being computed on another thread when the rows are read.
    digests: list[Future[str]] = field(default_factory=list)
    ignored_columns: list[str] = field(default_factory=list)
    # One `column_type` violation per file and column with values that do not fit, and
    # per row the text of the types its values do not fit (null where all fit).
    type_violations: list[Violation] = field(default_factory=list)
    type_errors: pl.Series | None = None

    @property
    def inputs(self) -> list[dict[str, Any]]:
        """path, sha256 and rows of each file; waits for a digest not yet computed (a
        build hands the digests on to `SampleTable`, which asks for them last)."""
        return input_records(self.files, self.digests)


def input_records(
    files: Sequence[dict[str, Any]], digests: Sequence[Future[str]]
) -> list[dict[str, Any]]:
    """The manifest's record of each input file (path, sha256, rows): `files` (path, rows)
    with their digests, waiting for any not yet computed."""
    return [
        {"path": f["path"], "sha256": digest.result(), "rows": f["rows"]}
        for f, digest in zip(files, digests, strict=True)
    ]


INT64_MAX = 2**63 - 1
# Names a user may mean as an input that the readers do not take: another case or
# spelling of a table suffix, or a step name with a suffix of no table.
LOOK_ALIKE = re.compile(r"(?i)^step=\d+\.|\.(parquet|parq|pq|arrow|feather|ipc|jsonl|ndjson)$")
STEP_FOLDER = re.compile(r"^step=\d+$")


def _is_table(path: Path) -> bool:
    """A table name; a dangling symlink so named counts (it is that step's unreadable file)."""
    if path.suffix not in TABLE_SUFFIXES or path.name.startswith("."):
        return False
    return path.is_file() or (path.is_symlink() and not path.exists())


def _look_alike(path: Path) -> bool:
    return (
        not path.name.startswith(".") and not path.is_dir() and bool(LOOK_ALIKE.search(path.name))
    )


def _ambiguous(step: int | None, first: Path, second: Path, why: str) -> StepError:
    message = f"{first} and {second} {why}: rename or move one of them"
    files = [str(first), str(second)]
    return StepError([Violation("ambiguous_step_path", message, step=step, files=files)])


def _tables_under(folder: Path, skipped: list[Path]) -> list[Path]:
    tables = []
    for p in sorted(folder.rglob("*"), key=str):
        if p.is_dir() and STEP_FOLDER.match(p.name):
            raise _ambiguous(_step_of(folder), folder, p, "both name a step, one inside the other")
        if _is_table(p):
            tables.append(p)
        elif _look_alike(p):
            skipped.append(p)
    return tables


def _step_of(path: Path) -> int | None:
    match = STEP_NAME.match(path.name)
    if not match:
        return None
    step = int(match.group(1))
    if step > INT64_MAX:
        message = f"step number {match.group(1)} in the name is beyond int64"
        raise StepError([Violation("step_out_of_range", message, files=[str(path)])])
    return step


def _check_one_name_per_step(children: Sequence[Path]) -> None:
    """In one folder, `step=007` beside `step=7` or `step=1.parquet` beside `step=1/`."""
    first: dict[int, Path] = {}
    for child in children:
        step = _step_of(child)
        if step is None or not (child.is_dir() or _is_table(child)):
            continue
        seen = first.setdefault(step, child)
        if seen is not child:
            raise _ambiguous(step, seen, child, f"both name step {step}")


def find_sources(
    inputs: Sequence[str | Path],
    session_version: str | None = None,
    notes: list[str] | None = None,
    skipped: list[Path] | None = None,
) -> list[SourceFile]:
    """Every table file under the inputs, with the step its path names (CONTRACT section 1);
    miles dump folders and .pt files too (SEMANTICS section 9). Notes on skipped files
    are appended to `notes`, and files that look like inputs but are not read to
    `skipped`. Two paths naming one step ambiguously are a StepError."""
    found: list[SourceFile] = []
    passed: list[Path] = []
    for raw in inputs:
        path = Path(raw)
        if not path.exists() and not path.is_symlink():
            raise UsageError(f"input {path} does not exist")
        if is_miles_dump(path):
            dumps, dump_notes = find_miles_dumps(path)
            if notes is not None:
                notes.extend(dump_notes)
            found.extend(SourceFile(p, step, "miles", session_version) for step, p in dumps.items())
            continue
        step = _step_of(path)
        if not path.is_dir():
            if not _is_table(path):
                raise UsageError(
                    f"input {path} is not a table (expected {', '.join(TABLE_SUFFIXES)})"
                )
            found.append(SourceFile(path, step))
        elif step is not None:
            found.extend(SourceFile(p, step) for p in _tables_under(path, passed))
        else:
            children = sorted(path.iterdir(), key=str)
            _check_one_name_per_step(children)
            for child in children:
                child_step = _step_of(child)
                if child.is_dir() and child_step is not None:
                    found.extend(SourceFile(p, child_step) for p in _tables_under(child, passed))
                elif _is_table(child):
                    found.append(SourceFile(child, child_step))
                elif _look_alike(child):
                    passed.append(child)
    for path in passed:
        if notes is not None:
            notes.append(
                f"skipped {path}: not a regular file named step=<N>.parquet, .arrow, "
                ".feather or .jsonl (lower case)"
            )
        if skipped is not None:
            skipped.append(path)
    return found


def _unreadable(path: Path, step: int | None, reason: str) -> StepError:
    return StepError(
        [Violation(rule="unreadable_file", message=reason, step=step, files=[str(path)])]
    )


def _json_kind(value: object) -> str:
    if isinstance(value, dict):
        return "object"
    return "array" if isinstance(value, list) else "scalar"


def _json_name(value: object) -> str:
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "an array"
    if isinstance(value, bool):
        return "a boolean"
    return "a string" if isinstance(value, str) else "a number"


def _json_kind_of_target(target: PolarsDataType) -> str:
    if isinstance(target, pl.List):
        return "list of " + _json_kind_of_target(target.inner)
    if target == pl.Boolean:
        return "bool"
    return "number" if target.is_numeric() else "string"


# The JSON kind each typed column takes; prompt, metadata and train_metadata take any.
JSON_TARGETS = {
    name: _json_kind_of_target(dtype)
    for name, dtype in {**c.INPUT_SCHEMA, c.REWARD: pl.Float64()}.items()
    if name not in JSON_TEXT_COLUMNS
}
# A key of a typed column, for the check that no line gives one twice.
TYPED_KEY = '"(?:' + "|".join(map(re.escape, JSON_TARGETS)) + r')"\s*:'


def _misfits(value: object, kind: str) -> bool:
    """A JSON value that does not have its column's kind, which Python or Polars would
    coerce silently or refuse for the whole file: true or "0" where a number belongs,
    ["11"] or "1,1" where a list of numbers belongs, a string where a boolean belongs."""
    if value is None:
        return False
    if kind.startswith("list of "):
        inner = kind.removeprefix("list of ")
        return not isinstance(value, list) or any(_misfits(v, inner) for v in value)
    if kind == "number":
        return isinstance(value, bool | str)
    return kind == "bool" and isinstance(value, str)


def _object_pairs(pairs: list[tuple[str, object]]) -> dict[str, Any]:
    """A JSON object; a key given twice is set to null and flagged `duplicate_key`."""
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            # The first value stays, so the line's row keeps its index and leaf.
            record[JSON_RULE + key] = "duplicate_key"
            continue
        record[key] = value
    return record


def _flag_misfits(record: dict[str, Any]) -> dict[str, Any]:
    for key, kind in JSON_TARGETS.items():
        value = record.get(key)
        if _misfits(value, kind):
            record.setdefault(JSON_RULE + key, "column_type")
            record[JSON_VALUE + key] = json.dumps(value)
            record[key] = None
    return record


def _json_objects(path: Path, step: int | None) -> list[dict[str, Any]]:
    """Every line as a JSON object, or an error naming the first line that is not one.
    A value of the wrong JSON kind, or a key given twice, is set to null and its rule
    and text kept under JSON_RULE/JSON_VALUE keys, for `conform` to report as that row's."""
    records = []
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line, object_pairs_hook=_object_pairs)
            except ValueError as exc:
                reason = getattr(exc, "msg", str(exc))
                raise _unreadable(
                    path, step, f"line {number} is not a JSON object ({reason})"
                ) from None
            if not isinstance(record, dict):
                kind = type(record).__name__
                raise _unreadable(path, step, f"line {number} is not a JSON object (a {kind})")
            records.append((number, _flag_misfits(record)))
    first: dict[str, tuple[int, object]] = {}
    for number, record in records:
        for key, value in record.items():
            if value is None or key.startswith((JSON_RULE, JSON_VALUE)):
                continue
            seen = first.setdefault(key, (number, value))
            if _json_kind(seen[1]) != _json_kind(value):
                raise _unreadable(
                    path,
                    step,
                    f"line {number}: {key} is {_json_name(value)} where line {seen[0]} has "
                    f"{_json_name(seen[1])}",
                )
    return [record for _, record in records]


def _json_suspect(path: Path, frame: pl.DataFrame) -> bool:
    """Whether Polars' reading may have coerced a value: a typed column that Polars read
    as another kind (strings or booleans where numbers belong), or a line naming a typed
    key twice (Polars keeps one of them). Such files take the per-line path."""
    for name, dtype in frame.schema.items():
        want = JSON_TARGETS.get(name)
        if want is None or (name == c.REWARD and isinstance(dtype, pl.Struct)):
            continue
        have: PolarsDataType = dtype
        while isinstance(have, pl.List) and want.startswith("list of "):
            have, want = have.inner, want.removeprefix("list of ")
        kind = _kind(have)
        if kind not in ("null", want) and not (kind == "number" and want == "bool"):
            return True
    lines = pl.Series(path.read_bytes().decode("utf-8", "replace").splitlines())
    keys = lines.str.extract_all(TYPED_KEY)
    return bool((keys.list.len() != keys.list.n_unique()).any())


def _read_jsonl(path: Path, step: int | None) -> pl.DataFrame:
    try:
        frame = pl.read_ndjson(path, infer_schema_length=None)
        if not _json_suspect(path, frame):
            return frame
    except pl.exceptions.PolarsError:
        pass
    # Slow path, only for files polars refuses or may have coerced: name the offending
    # line, flag values of the wrong kind per row, and accept the NaN and Infinity that
    # Python's json.dumps writes (reward_finite rejects them).
    records = _json_objects(path, step)
    try:
        return pl.from_dicts(records, infer_schema_length=None)
    except (pl.exceptions.PolarsError, TypeError, ValueError) as exc:
        raise _unreadable(path, step, f"not valid JSON Lines: {first_line(exc)}") from None


# A Parquet file smaller than this is read plainly: below it, four reads (each parsing the
# footer) on a pool cost more than the second core saves. 64 samples (0.56 MB): 7-9 ms
# plain against 13-24 ms split; 512 (3.6 MB) 23-31 against 25-51 ms; 1024 (6.1 MB) 35-52
# against 40 ms; 8192 (38 MB) split is faster (docs/performance.md).
SPLIT_READ_BYTES = 4 << 20


def _read_parquet(path: Path, size: int) -> pl.DataFrame:
    """A Parquet file of `size` bytes, its list columns each decoded on a thread of its own.

    Polars decodes a row group's columns one after another, and writers such as pyarrow
    put a whole step in one row group, so a plain read keeps one core busy; the list
    columns hold nearly all the bytes. Any failure falls back to a plain read, whose error
    is the one to report."""
    if size < SPLIT_READ_BYTES:
        return pl.read_parquet(path)
    try:
        schema = pl.read_parquet_schema(path)
        lists = [name for name, dtype in schema.items() if isinstance(dtype, pl.List)]
        rest = [name for name in schema if name not in lists]
        groups = [[name] for name in lists] + ([rest] if rest else [])
        if len(groups) < 2:
            return pl.read_parquet(path)
        workers = min(len(groups), os.cpu_count() or 1)
        finished = itertools.count(1)

        def read(columns: list[str]) -> pl.DataFrame:
            frame = pl.read_parquet(path, columns=columns)
            # once no group waits for a thread, each group done leaves a core free
            if next(finished) > len(groups) - workers:
                core_free.set()
            return frame

        with ThreadPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(read, groups))
        return pl.concat(parts, how="horizontal").select(list(schema))
    except Exception:  # noqa: BLE001 - the plain read below reports it
        return pl.read_parquet(path)


def read_table(path: Path, step: int | None = None) -> pl.DataFrame:
    """One input file as a DataFrame, in file order; an unreadable file is a StepError."""
    kind = TABLE_SUFFIXES[path.suffix]
    try:
        size = path.stat().st_size
    except OSError as exc:
        what = "a dangling symlink" if path.is_symlink() else exc.strerror
        raise _unreadable(path, step, f"cannot open the file ({what})") from None
    if size == 0:
        raise _unreadable(path, step, "the file is empty")
    try:
        if kind == "parquet":
            return _read_parquet(path, size)
        if kind == "ipc":
            return pl.read_ipc(path)
        return _read_jsonl(path, step)
    except StepError:
        raise
    except Exception as exc:  # noqa: BLE001 - any reader failure is the file's fault
        raise _unreadable(path, step, f"cannot read {kind}: {first_line(exc)}") from exc


def read_source(source: SourceFile, step: int | None = None) -> pl.DataFrame:
    if source.kind == "miles":
        return read_miles_dump(source.path, source.session_version)
    return read_table(source.path, step)


def _kind(dtype: PolarsDataType) -> str:
    if isinstance(dtype, pl.List | pl.Array):
        return "list"
    if isinstance(dtype, pl.Struct):
        return "struct"
    if dtype == pl.Boolean:
        return "bool"
    if dtype == pl.Null:
        return "null"
    if dtype.is_numeric():
        return "number"
    return "string" if isinstance(dtype, pl.String | pl.Categorical | pl.Enum) else "other"


def _fits(value: pl.Expr, source: PolarsDataType, target: PolarsDataType) -> pl.Expr:
    """True where a non-null value converts to the target type without loss: 1.5 is not
    an integer, 1e300 is not a float32, 2 is not a boolean, a list holds no nulls."""
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
        # Nothing to lose; skipping the checks below saves ~40 ms on 30M float32 log probs.
        return value.is_not_null()
    cast = value.cast(target, strict=False)
    fits = cast.is_not_null()
    if target.is_integer() and source.is_float():
        fits = fits & (value == value.floor())
    elif target.is_float() and source.is_numeric():
        fits = fits & (cast.is_finite() | ~value.is_finite())
    elif target == pl.Boolean and source.is_integer():
        fits = fits & value.is_in([0, 1])
    return fits


def _json_text(value: pl.Expr) -> pl.Expr:
    """Any value as its JSON text; null stays null."""
    encoded = pl.struct(value.alias("v")).struct.json_encode()
    return pl.when(value.is_not_null()).then(encoded.str.slice(5).str.strip_suffix("}"))


def _column_kinds_agree(source: pl.DataType, target: pl.DataType) -> bool:
    have, want = _kind(source), _kind(target)
    if have == want == "list":  # Polars casts a list of structs to a list of ints as is
        return _column_kinds_agree(source.inner, target.inner)  # type: ignore[attr-defined]
    if have == "null" or have == want:
        return True
    return {have, want} <= {"number", "string"} or (have == "number" and want == "bool")


def _wrong_type(
    name: str, source: pl.DataType, target: pl.DataType, path: Path, step: int | None
) -> Violation:
    return Violation(
        rule="column_type",
        message=f"column {name} must be {target}, but the file stores it as {source}",
        step=step,
        files=[str(path)],
    )


Plan = tuple[pl.Expr, pl.Expr | None]


def _cast_plan(
    frame: pl.DataFrame, name: str, target: pl.DataType, path: Path, step: int | None
) -> Plan | Violation:
    """The column as its contract type, and the expression marking rows whose value does
    not fit (None: every value fits); or, for a column whose type cannot hold the contract
    type at all (the file's fault), its `column_type` violation."""
    source = frame.schema[name]
    value = pl.col(name)
    if name in JSON_TEXT_COLUMNS and _kind(source) in ("list", "struct"):
        return _json_text(value).alias(name), None
    if not _column_kinds_agree(source, target):
        return _wrong_type(name, source, target, path, step)
    bad = (value.is_not_null() & ~_fits(value, source, target).fill_null(False)).alias(name)
    return value.cast(target, strict=False), bad


def _bad_rows(
    frame: pl.DataFrame,
    plans: dict[str, Plan | Violation],
    types: dict[str, pl.DataType],
    path: Path,
    step: int | None,
) -> dict[str, pl.Series | Violation]:
    """Per planned column, the mask of rows whose value does not fit, all in one query
    (a query per column cost a small step ~4 ms each); a column's violation where its type
    is wrong, or where the checks cannot even read its values (found column by column)."""
    checks = {
        name: plan[1]
        for name, plan in plans.items()
        if not isinstance(plan, Violation) and plan[1] is not None
    }
    fit = pl.repeat(False, frame.height, eager=True)
    masks: dict[str, pl.Series | Violation] = {
        name: plan if isinstance(plan, Violation) else fit for name, plan in plans.items()
    }
    try:
        found = frame.select(*checks.values())
        masks.update({name: found.get_column(name) for name in checks})
    except pl.exceptions.PolarsError:
        for name, bad in checks.items():
            try:
                masks[name] = frame.select(bad).to_series()
            except pl.exceptions.PolarsError:
                masks[name] = _wrong_type(name, frame.schema[name], types[name], path, step)
    return masks


def _cast_column(
    frame: pl.DataFrame, name: str, target: pl.DataType, path: Path, step: int | None
) -> tuple[pl.Expr, pl.Series]:
    """One column as its contract type, and the mask of rows whose value does not fit."""
    plan = _cast_plan(frame, name, target, path, step)
    (bad,) = _bad_rows(frame, {name: plan}, {name: target}, path, step).values()
    if isinstance(bad, Violation):
        raise StepError([bad])
    assert not isinstance(plan, Violation)  # a wrong type's mask is its violation
    return plan[0], bad


def _reward_dtype(series: pl.Series) -> pl.DataType:
    if isinstance(series.dtype, pl.Struct):
        return pl.Struct({f.name: pl.Float64() for f in series.dtype.fields})
    return pl.Float64()


def _value_text(frame: pl.DataFrame, name: str, bad: pl.Series) -> str:
    text = frame.filter(bad).select(_json_text(pl.col(name))).to_series()[0] or "null"
    return text if len(text) <= VALUE_TEXT_CHARS else text[:VALUE_TEXT_CHARS] + "..."


def conform(
    frame: pl.DataFrame, path: Path, step: int | None
) -> tuple[pl.DataFrame, list[str], list[Violation]]:
    """Cast every contract column to its type. Rows whose values do not fit are marked in
    TYPE_ERROR and named in one `column_type` violation per column; a missing required
    column or a column of an impossible type fails the whole file (StepError).
    Returns the typed frame, the extra (ignored) columns and those violations."""
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
    types = dict(c.INPUT_SCHEMA)
    if c.REWARD in frame.columns:
        types[c.REWARD] = _reward_dtype(frame.get_column(c.REWARD))
    plans = {
        name: _cast_plan(frame, name, types[name], path, step)
        for name in frame.columns
        if name in types
    }
    cast_columns, reasons, violations, errors = [], [], [], []
    for name, bad in _bad_rows(frame, plans, types, path, step).items():
        if isinstance(bad, Violation):
            errors.append(bad)
            continue
        plan = plans[name]
        assert not isinstance(plan, Violation)  # a wrong type's mask is its violation
        cast_columns.append(plan[0])
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
            violations.append(_row_violation(frame, name, mask, rule, expected, path, step))
            reasons.append(pl.when(pl.lit(mask)).then(pl.lit(f"{rule}: {expected}")))
    if errors:
        raise StepError(errors)
    type_error = (
        pl.concat_str(reasons, separator="; ", ignore_nulls=True).replace("", None)
        if reasons
        else pl.lit(None, dtype=pl.String)
    )
    internal = [n for n in frame.columns if n.startswith((JSON_RULE, JSON_VALUE))]
    extra = [
        name
        for name in frame.columns
        if name not in types and name != c.SOURCE_ROW and name not in internal
    ]
    typed = frame.with_columns(*cast_columns, type_error.alias(TYPE_ERROR)).drop(extra, *internal)
    return typed, extra, violations


def _json_flags(frame: pl.DataFrame, name: str) -> pl.Series | None:
    """Per row, the rule the JSON Lines reader flagged on this column's value ("" where
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
    path: Path,
    step: int | None,
) -> Violation:
    """One rule broken by values of one column, naming the first file row and its value."""
    rows = frame.filter(mask)
    first_row = int(rows.get_column(c.SOURCE_ROW)[0]) + 1 if c.SOURCE_ROW in rows else None
    where = f" at file row {first_row}" if first_row is not None else ""
    original = rows.get_column(JSON_VALUE + name)[0] if JSON_VALUE + name in rows.columns else None
    if rule == "duplicate_key":
        message = f"{expected}, but it is given twice{where}"
    else:
        text = original if original is not None else _value_text(frame, name, mask)
        message = f"{expected}, got {text}{where}"
    return Violation(
        rule=rule,
        message=message,
        step=step,
        files=[str(path)],
        rows=_index_leaf_pairs(rows),
        n_rows=rows.height,
    )


def _index_leaf_pairs(rows: pl.DataFrame, limit: int = 5) -> list[tuple[int, int]]:
    index = rows.get_column(c.INDEX).head(limit) if c.INDEX in rows.columns else None
    leaf = rows.get_column(c.LEAF).head(limit) if c.LEAF in rows.columns else None
    if index is None:
        return []
    leaves = leaf.to_list() if leaf is not None else [None] * index.len()
    return list(zip(index.to_list(), leaves, strict=True))


def _with_provenance(frame: pl.DataFrame, path: Path, path_step: int | None) -> pl.DataFrame:
    return frame.with_columns(
        pl.lit(str(path)).alias(c.SOURCE_FILE),
        pl.lit(path_step, dtype=pl.Int64).alias(PATH_STEP),
    )


def _column_steps(source: SourceFile, frame: pl.DataFrame) -> list[int]:
    """The steps named by the `step` column of a file whose path names none; every row
    must name one, since a row without a step belongs to no step's accounting."""
    if c.STEP not in frame.columns:
        raise StepError(
            [
                Violation(
                    rule="missing_column",
                    message="no step in the file name (step=<N>.<ext>) and no step column",
                    files=[str(source.path)],
                )
            ]
        )
    with_rows = frame.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(c.SOURCE_ROW))
    cast, bad = _cast_column(with_rows, c.STEP, pl.Int64(), source.path, None)
    bad = bad | frame.get_column(c.STEP).is_null()
    if bad.any():
        rows = with_rows.filter(bad)
        first = int(rows.get_column(c.SOURCE_ROW)[0]) + 1
        raise StepError(
            [
                Violation(
                    rule="column_type",
                    message="column step must hold a step number on every row when the file "
                    f"name carries no step; file row {first} has {_value_text(frame, c.STEP, bad)}",
                    files=[str(source.path)],
                    rows=_index_leaf_pairs(rows),
                    n_rows=rows.height,
                )
            ]
        )
    return frame.select(cast).to_series().unique().sort().to_list()


def group_steps(sources: Iterable[SourceFile]) -> dict[int, list[SourceFile]]:
    """Steps and their files in lexicographic path order; files without a path step are
    assigned by the values of their `step` column (read once, column only)."""
    steps: dict[int, list[SourceFile]] = {}
    for source in sources:
        if source.step is not None:
            steps.setdefault(source.step, []).append(source)
            continue
        try:
            values = _column_steps(source, read_source(source))
        except StepError as error:
            for violation in error.violations:
                violation.message += (
                    "; no step was built: the rows of a file whose name carries no step "
                    "could belong to any step, so no step can be called complete"
                )
            raise
        for value in values:
            steps.setdefault(int(value), []).append(source)
    return {step: sorted(files, key=lambda s: str(s.path)) for step, files in sorted(steps.items())}


def load_step(step: int, sources: Sequence[SourceFile]) -> LoadedStep:
    """Read, type and concatenate a step's files in batch order, with provenance columns.
    Each file is hashed on a second thread (hashlib releases the GIL); the digests are
    left to finish while the caller validates and plans (`SampleTable.inputs`)."""
    frames, files, extras, type_violations = [], [], set(), []
    hasher = ThreadPoolExecutor(max_workers=1)
    digests = [hasher.submit(sha256_of, source.path) for source in sources]
    sizes = []
    try:
        # the program's head start on hashing waits while Polars decodes (io/checksums.py)
        with checksums.paused():
            for source in sources:
                frame = read_source(source, step).with_columns(
                    pl.int_range(pl.len(), dtype=pl.Int64).alias(c.SOURCE_ROW)
                )
                sizes.append(source.path.stat().st_size)
                if source.step is None:
                    frame = frame.filter(pl.col(c.STEP).cast(pl.Int64, strict=False) == step)
                frame, extra, found = conform(frame, source.path, step)
                extras.update(extra)
                type_violations += found
                files.append({"path": str(source.path), "rows": frame.height})
                frames.append(_with_provenance(frame, source.path, source.step))
        core_free.set()
        _check_no_identical_files(files, sizes, digests, step)
    except BaseException:
        hasher.shutdown(wait=False, cancel_futures=True)
        raise
    hasher.shutdown(wait=False)
    _check_one_reward_type(frames, step)
    frame = pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]
    if c.STEP not in frame.columns:
        frame = frame.with_columns(pl.col(PATH_STEP).alias(c.STEP))
    else:
        frame = frame.with_columns(pl.col(c.STEP).fill_null(pl.col(PATH_STEP)))
    # A missing remove_sample (absent column, or a JSON object without the key) is false.
    if c.REMOVE_SAMPLE not in frame.columns:
        frame = frame.with_columns(pl.lit(False).alias(c.REMOVE_SAMPLE))
    else:
        frame = frame.with_columns(pl.col(c.REMOVE_SAMPLE).fill_null(False))
    if c.LEAF not in frame.columns:
        frame = frame.with_columns(
            pl.int_range(pl.len(), dtype=pl.Int32).over(c.STEP, c.INDEX).alias(c.LEAF)
        )
    return LoadedStep(
        step=step,
        frame=frame.drop(TYPE_ERROR),
        files=files,
        digests=digests,
        ignored_columns=sorted(extras),
        type_violations=type_violations,
        type_errors=frame.get_column(TYPE_ERROR),
    )


def _check_no_identical_files(
    files: Sequence[dict[str, Any]], sizes: Sequence[int], digests: Sequence[Future[str]], step: int
) -> None:
    """Two byte-identical files of one step are one file's rows given twice. Only files of
    one size can be: their digests are compared, the others' are not waited for."""
    shared = {size for size, count in Counter(sizes).items() if count > 1}
    first: dict[str, str] = {}
    for entry, size, digest in zip(files, sizes, digests, strict=True):
        if size not in shared:
            continue
        path, sha256 = entry["path"], digest.result()
        seen = first.get(sha256)
        if seen is None:
            first[sha256] = path
            continue
        message = (
            f"{path} is given twice: its rows would be read twice"
            if seen == path
            else f"{seen} and {path} are byte-identical: the same rows twice"
        )
        files_named = [seen] if seen == path else [seen, path]
        raise StepError([Violation("identical_input_files", message, step=step, files=files_named)])


def _check_one_reward_type(frames: Sequence[pl.DataFrame], step: int) -> None:
    """A struct reward in one file and a number in another would silently become structs."""
    kinds: dict[bool, str] = {}
    for frame in frames:
        if c.REWARD in frame.columns and frame.height:
            is_struct = isinstance(frame.schema[c.REWARD], pl.Struct)
            kinds.setdefault(is_struct, frame.get_column(c.SOURCE_FILE)[0])
    if len(kinds) > 1:
        raise StepError(
            [
                Violation(
                    rule="column_type",
                    message=f"reward is a struct in {kinds[True]} but a number in "
                    f"{kinds[False]}: every file of a step must store reward the same way",
                    step=step,
                    files=[kinds[True], kinds[False]],
                )
            ]
        )
