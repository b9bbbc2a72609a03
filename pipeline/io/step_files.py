"""A step's files as they are read: their typed rows in batch order, their manifest records
and what typing found (`StepFiles`), and the whole step once read (`LoadedStep`). Both
reads, whole (`io.load.load_step`) and in parts (`step.readers`), fill one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import columns as c
from pipeline.columns import PATH_STEP, TYPE_ERROR
from pipeline.errors import StepError, Violation, printable
from pipeline.io.conform import ROWS_NAMED, conform
from pipeline.io.discovery import SourceFile


@dataclass
class LoadedStep:
    """A step's rows in batch order with provenance, before validation."""

    step: int
    frame: pl.DataFrame
    files: list[dict[str, Any]] = field(default_factory=list)  # path, sha256, rows
    ignored_columns: list[str] = field(default_factory=list)
    # One `column_type` violation per file and column with values that do not fit, and
    # per row the text of the types its values do not fit (null where all fit).
    type_violations: list[Violation] = field(default_factory=list)
    type_errors: pl.Series | None = None


@dataclass
class StepFiles:
    """A step's files as they are read: their typed rows in batch order (a file's rows may
    come in parts, `add_rows` once per part), their manifest records and what typing found."""

    step: int
    frames: list[pl.DataFrame] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)  # path, sha256, rows
    extras: set[str] = field(default_factory=set)
    type_violations: list[Violation] = field(default_factory=list)
    # each type violation by (file, column, rule), with its place among the file's
    _named: dict[tuple[str, str, str], tuple[int, int, Violation]] = field(default_factory=dict)

    def add_rows(self, source: SourceFile, frame: pl.DataFrame, first: int = 0) -> pl.DataFrame:
        """Rows `first`.. of `source` as stored, typed (`conform`), with provenance; rows of
        other steps (a file without a path step) are left out."""
        frame = frame.with_columns(
            pl.int_range(first, first + pl.len(), dtype=pl.Int64).alias(c.SOURCE_ROW)
        )
        if source.step is None:
            frame = frame.filter(pl.col(c.STEP).cast(pl.Int64, strict=False) == self.step)
        json_numbers = source.kind == "table" and source.path.suffix == ".jsonl"
        columns = frame.columns
        frame, extra, found = conform(frame, source.path, self.step, json_numbers)
        self.extras.update(extra)
        for name, violation in found:
            self._add_type_violation(source, columns, name, violation)
        return _with_provenance(frame, source.path, source.step)

    def _add_type_violation(
        self, source: SourceFile, columns: list[str], name: str, violation: Violation
    ) -> None:
        """One file's violation of a rule by one column, whichever part of the file its
        rows are in: a file read in parts gets the one line a whole read gives (its first
        rows and first value, every row counted), in the file's column order."""
        place = columns.index(name) if name in columns else len(columns)
        self.add_type_violation(source, place, name, violation)

    def add_type_violation(
        self, source: SourceFile, place: int, name: str, violation: Violation
    ) -> None:
        """A violation of column `name` (the `place`-th of the file's columns) found in a
        part of `source` read elsewhere (a share, `step.readers.shares`), merged as
        `add_rows` merges."""
        key = (str(source.path), name, violation.rule)
        if key not in self._named:
            self._named[key] = (len(self.files), place, violation)
        else:
            earlier = self._named[key][2]
            earlier.rows += violation.rows[: ROWS_NAMED - len(earlier.rows)]
            earlier.n_rows += violation.n_rows
        named = sorted(self._named.values(), key=lambda entry: entry[:2])
        self.type_violations = [entry[2] for entry in named]

    def named(self) -> list[tuple[int, str, Violation]]:
        """Each type violation with its column's place among the file's and its column."""
        return [(place, key[1], violation) for key, (_, place, violation) in self._named.items()]

    def add_file(self, source: SourceFile, sha256: str, rows: int) -> None:
        self.files.append({"path": str(source.path), "sha256": sha256, "rows": rows})

    def loaded(self) -> LoadedStep:
        """The step's rows (`frames`) concatenated, its filled columns filled."""
        step, frames = self.step, self.frames
        _check_no_identical_files(self.files, step)
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
            files=self.files,
            ignored_columns=sorted(self.extras),
            type_violations=self.type_violations,
            type_errors=frame.get_column(TYPE_ERROR),
        )


def _with_provenance(frame: pl.DataFrame, path: Path, path_step: int | None) -> pl.DataFrame:
    # A name that is not UTF-8 cannot be a Polars string: it is kept as messages show it.
    return frame.with_columns(
        pl.lit(printable(str(path))).alias(c.SOURCE_FILE),
        pl.lit(path_step, dtype=pl.Int64).alias(PATH_STEP),
    )


def _check_no_identical_files(files: Sequence[dict[str, Any]], step: int) -> None:
    """Two byte-identical files of one step are one file's rows given twice."""
    first: dict[str, str] = {}
    for entry in files:
        path, sha256 = entry["path"], entry["sha256"]
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
