"""Readers: find the steps under input paths and load a step's rows in batch order."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, UsageError, Violation
from pipeline.io.miles_dump import find_miles_dumps, is_miles_dump, read_miles_dump

TABLE_SUFFIXES = {".parquet": "parquet", ".arrow": "ipc", ".feather": "ipc", ".jsonl": "jsonl"}
STEP_NAME = re.compile(r"^step=(\d+)(\.[a-z]+)?$")
PATH_STEP = "_path_step"


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
    inputs: list[dict] = field(default_factory=list)  # path, sha256, rows
    ignored_columns: list[str] = field(default_factory=list)


def _is_table(path: Path) -> bool:
    return path.suffix in TABLE_SUFFIXES and not path.name.startswith(".")


def _tables_under(folder: Path) -> list[Path]:
    return sorted((p for p in folder.rglob("*") if p.is_file() and _is_table(p)), key=str)


def _step_of(path: Path) -> int | None:
    match = STEP_NAME.match(path.name)
    return int(match.group(1)) if match else None


def find_sources(
    inputs: Sequence[str | Path],
    session_version: str | None = None,
    notes: list[str] | None = None,
) -> list[SourceFile]:
    """Every table file under the inputs, with the step its path names (CONTRACT section 1);
    miles dump folders and .pt files too (SEMANTICS section 9). Notes on skipped files
    are appended to `notes`."""
    found: list[SourceFile] = []
    for raw in inputs:
        path = Path(raw)
        if not path.exists():
            raise UsageError(f"input {path} does not exist")
        if is_miles_dump(path):
            dumps, dump_notes = find_miles_dumps(path)
            if notes is not None:
                notes.extend(dump_notes)
            found.extend(
                SourceFile(p, step, "miles", session_version) for step, p in dumps.items()
            )
            continue
        step = _step_of(path)
        if path.is_file():
            if not _is_table(path):
                raise UsageError(
                    f"input {path} is not a table (expected {', '.join(TABLE_SUFFIXES)})"
                )
            found.append(SourceFile(path, step))
        elif step is not None:
            found.extend(SourceFile(p, step) for p in _tables_under(path))
        else:
            for child in sorted(path.iterdir(), key=str):
                child_step = _step_of(child)
                if child.is_dir() and child_step is not None:
                    found.extend(SourceFile(p, child_step) for p in _tables_under(child))
                elif child.is_file() and _is_table(child):
                    found.append(SourceFile(child, child_step))
    return found


def _unreadable(path: Path, step: int | None, reason: str) -> StepError:
    return StepError(
        [Violation(rule="unreadable_file", message=reason, step=step, files=[str(path)])]
    )


def _read_jsonl(path: Path, step: int | None) -> pl.DataFrame:
    try:
        return pl.read_ndjson(path, infer_schema_length=None)
    except (pl.exceptions.ComputeError, pl.exceptions.PolarsError) as exc:
        # Name the first line that is not a JSON object, which polars does not.
        import json

        with path.open("rb") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    if not isinstance(json.loads(line), dict):
                        raise ValueError("not an object")
                except ValueError:
                    raise _unreadable(path, step, f"line {number} is not a JSON object") from exc
        raise _unreadable(path, step, f"not valid JSON Lines: {str(exc).splitlines()[0]}") from exc


def read_table(path: Path, step: int | None = None) -> pl.DataFrame:
    """One input file as a DataFrame, in file order; an unreadable file is a StepError."""
    kind = TABLE_SUFFIXES[path.suffix]
    if path.stat().st_size == 0:
        raise _unreadable(path, step, "the file is empty")
    try:
        if kind == "parquet":
            return pl.read_parquet(path)
        if kind == "ipc":
            return pl.read_ipc(path)
        return _read_jsonl(path, step)
    except StepError:
        raise
    except Exception as exc:  # noqa: BLE001 - any reader failure is the file's fault
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _unreadable(path, step, f"cannot read {kind}: {first}") from exc


def read_source(source: SourceFile, step: int | None = None) -> pl.DataFrame:
    if source.kind == "miles":
        return read_miles_dump(source.path, source.session_version)
    return read_table(source.path, step)


def sha256_of(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _cast_column(frame: pl.DataFrame, name: str, dtype: pl.DataType) -> tuple[pl.Series, pl.Series]:
    """The column cast to its contract type, and a mask of rows that did not cast."""
    source = frame.get_column(name)
    cast = source.cast(dtype, strict=False)
    bad = cast.is_null() & source.is_not_null()
    if isinstance(dtype, pl.List):
        bad = bad | cast.list.eval(pl.element().is_null()).list.any().fill_null(False)
    return cast, bad


def _reward_dtype(series: pl.Series) -> pl.DataType:
    if isinstance(series.dtype, pl.Struct):
        return pl.Struct({f.name: pl.Float64() for f in series.dtype.fields})
    return pl.Float64()


def conform(frame: pl.DataFrame, path: Path, step: int | None) -> tuple[pl.DataFrame, list[str]]:
    """Cast every contract column to its type; name rows that do not fit. Returns extra columns."""
    violations: list[Violation] = []
    missing = [name for name in c.REQUIRED_COLUMNS if name not in frame.columns]
    if step is None and c.STEP not in frame.columns:
        missing.insert(0, c.STEP)
    if missing:
        violations.append(
            Violation(
                rule="missing_column",
                message=f"required column(s) {', '.join(missing)} missing",
                step=step,
                files=[str(path)],
            )
        )
    types = dict(c.INPUT_SCHEMA)
    if c.REWARD in frame.columns:
        types[c.REWARD] = _reward_dtype(frame.get_column(c.REWARD))
    cast_columns = []
    for name in frame.columns:
        if name not in types:
            continue
        cast, bad = _cast_column(frame, name, types[name])
        if bad.any():
            rows = frame.filter(bad)
            violations.append(
                Violation(
                    rule="column_type",
                    message=f"column {name} must be {types[name]}, got {frame.schema[name]}",
                    step=step,
                    files=[str(path)],
                    rows=_index_leaf_pairs(rows),
                    n_rows=rows.height,
                )
            )
        cast_columns.append(cast)
    if violations:
        raise StepError(violations)
    extra = [name for name in frame.columns if name not in types]
    return frame.with_columns(cast_columns).drop(extra), extra


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
        pl.int_range(pl.len(), dtype=pl.Int64).alias(c.SOURCE_ROW),
        pl.lit(path_step, dtype=pl.Int64).alias(PATH_STEP),
    )


def group_steps(sources: Iterable[SourceFile]) -> dict[int, list[SourceFile]]:
    """Steps and their files in lexicographic path order; files without a path step are
    assigned by the values of their `step` column (read once, column only)."""
    steps: dict[int, list[SourceFile]] = {}
    for source in sources:
        if source.step is not None:
            steps.setdefault(source.step, []).append(source)
            continue
        frame = read_source(source)
        if c.STEP not in frame.columns:
            raise UsageError(
                f"{source.path}: no step in the file name (step=<N>.<ext>) and no `step` column"
            )
        values = frame.get_column(c.STEP).cast(pl.Int64, strict=False).drop_nulls().unique()
        for value in values.to_list():
            steps.setdefault(int(value), []).append(source)
    return {step: sorted(files, key=lambda s: str(s.path)) for step, files in sorted(steps.items())}


def load_step(step: int, sources: Sequence[SourceFile]) -> LoadedStep:
    """Read, type and concatenate a step's files in batch order, with provenance columns."""
    frames, inputs, extras = [], [], set()
    for source in sources:
        frame = read_source(source, step)
        frame, extra = conform(frame, source.path, step)
        extras.update(extra)
        if source.step is None:
            frame = frame.filter(pl.col(c.STEP) == step)
        inputs.append(
            {"path": str(source.path), "sha256": sha256_of(source.path), "rows": frame.height}
        )
        frames.append(_with_provenance(frame, source.path, source.step))
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
    return LoadedStep(step=step, frame=frame, inputs=inputs, ignored_columns=sorted(extras))
